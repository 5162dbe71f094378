# The validated study config every job reads, and the stamp that keeps one backend per study
# folder. Its input is the config staged when the workflow loads (rewritten only when it changes),
# so a config edit re-runs this rule and, through it, every job; each phase job then re-measures
# only the cells whose fingerprint changed (listed when the workflow loads).


rule study_config:
    input:
        STAGED_CONFIG,
    output:
        STUDY_CONFIG,
        str(LAYOUT.stamp),
    log:
        log_of("study_config"),
    params:
        ctax=CTAX,
    conda:
        ENV
    shell:
        "{params.ctax} pipeline study-config --config {input:q} > {log:q} 2>&1"
