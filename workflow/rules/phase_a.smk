# Phase A: per configuration, one server launch and the rate sweep at the Phase A shape.
# One rule per configuration, so each gets a priority from the seeded run order (the
# design's defence against thermal drift) while GPU jobs can still run side by side.

for _rank, _name in enumerate(RUN_ORDER):

    rule:
        name:
            f"phase_a_{_name}"
        input:
            config=STUDY_CONFIG,
            preflight=PREFLIGHT_STATUS,
        output:
            f"{RESULTS}/{_name}/phase_a/run.json",
        log:
            f"{RESULTS}/logs/phase_a_{_name}.log",
        params:
            python=PYTHON,
            name=_name,
            results=lambda wildcards, input: os.path.dirname(input.config),
        priority: len(RUN_ORDER) - _rank
        resources:
            gpu=GPUS_PER_JOB,
        conda:
            ENV
        shell:
            "{params.python} -m connector_tax.pipeline.phase --config {input.config:q} --name {params.name:q}"
            " --phase phase_a --results {params.results:q} > {log:q} 2>&1"


rule phase_a:
    input:
        expand(f"{RESULTS}/{{name}}/phase_a/run.json", name=CONFIGS),
