# Phase B: per configuration, one server launch and every shape at ref_safe; Phase B'
# (the priority configurations on the priority shapes at ref_load, only when it differs
# from ref_safe) runs in the same launch.

for _rank, _name in enumerate(RUN_ORDER):

    rule:
        name:
            f"phase_b_{_name}"
        input:
            config=STUDY_CONFIG,
            preflight=PREFLIGHT_STATUS,
            reference=REFERENCE_RATES,
        output:
            f"{RESULTS}/{_name}/phase_b/run.json",
        log:
            f"{RESULTS}/logs/phase_b_{_name}.log",
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
            " --phase phase_b --results {params.results:q} > {log:q} 2>&1"


rule phase_b:
    input:
        expand(f"{RESULTS}/{{name}}/phase_b/run.json", name=CONFIGS),
