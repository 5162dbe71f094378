# Pre-flight: each configuration's server must start and serve one streamed request;
# a failure is SKIP with its reason (preflight_status.json), and the study goes on.
# Jobs run in their own process, so Ctrl-C of snakemake reaches them and they stop their server.


rule preflight_config:
    input:
        STUDY_CONFIG,
    output:
        f"{RESULTS}/preflight/ready_{{name}}.json",
    log:
        f"{RESULTS}/logs/preflight_{{name}}.log",
    params:
        python=PYTHON,
        log_dir=lambda wildcards, output: os.path.join(os.path.dirname(output[0]), wildcards.name),
    resources:
        gpu=GPUS_PER_JOB,
    conda:
        ENV
    shell:
        "{params.python} -m connector_tax.pipeline.preflight check --config {input:q} --name {wildcards.name:q}"
        " --out {output:q} --log-dir {params.log_dir:q} > {log:q} 2>&1"


rule preflight:
    input:
        expand(f"{RESULTS}/preflight/ready_{{name}}.json", name=CONFIGS),
    output:
        PREFLIGHT_STATUS,
    log:
        f"{RESULTS}/logs/preflight.log",
    params:
        python=PYTHON,
    conda:
        ENV
    shell:
        "{params.python} -m connector_tax.pipeline.preflight merge --out {output:q} {input:q} > {log:q} 2>&1"
