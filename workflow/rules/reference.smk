# Reference rates: a checkpoint after every Phase A job — saturation per cell by the design's
# three criteria (with which fired), then ref_safe and ref_load.


rule reference:
    input:
        config=STUDY_CONFIG,
        runs=expand(f"{RESULTS}/{{name}}/phase_a/run.json", name=CONFIGS),
    output:
        REFERENCE_RATES,
    log:
        f"{RESULTS}/logs/reference.log",
    params:
        python=PYTHON,
        results=lambda wildcards, input: os.path.dirname(input.config),
    conda:
        ENV
    shell:
        "{params.python} -m connector_tax.pipeline.reference --config {input.config:q}"
        " --results {params.results:q} > {log:q} 2>&1"
