# The validated study config every job reads, and the study folder's stamp.


rule study_config:
    """The validated config the servers are launched with (the file plus any --config), and
    the stamp that keeps one backend per study folder."""
    output:
        STUDY_CONFIG,
        str(LAYOUT.stamp),
    log:
        log_of("study_config"),
    params:
        # the config itself: any change rewrites the file; every phase job then re-runs and
        # re-measures only the cells whose fingerprint changed (listed when the workflow loads)
        digest=sha(config),
    run:
        import yaml

        from connector_tax.atomic import write_atomic
        from connector_tax.pipeline.studyfolder import stamp_study_folder

        write_atomic(LAYOUT.study_config, yaml.safe_dump(config, sort_keys=False))
        stamp_study_folder(config)
