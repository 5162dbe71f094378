# Pre-flight: each configuration's server must start and serve one streamed request;
# a failure is SKIP with its reason (preflight_status.json), and the study goes on.
# Jobs run in their own process, so Ctrl-C of snakemake reaches them and they stop their server.
# Each verdict names the launch settings it checked (params.launch, measure.cellplan.launch_digest):
# a change of them re-runs the job even with the config untouched (another vLLM in its venv), and
# a phase job refuses an ok of other settings. Every run of a job launches again (Snakemake
# deletes its output first): no verdict is carried over from an earlier run.


rule preflight_config:
    input:
        STUDY_CONFIG,
    output:
        str(LAYOUT.preflight_ready("{name}")),
    log:
        log_of("preflight_{name}"),
    benchmark:
        str(LAYOUT.benchmark("preflight_{name}"))
    params:
        ctax=CTAX,
        log_dir=lambda wildcards: str(LAYOUT.preflight_logs(wildcards.name)),
        placement=PLACEMENT,
        launch=lambda wildcards: launch_digest(SETTINGS, STUDY_CONFIG, wildcards.name),
    resources:
        gpu=GPUS_PER_JOB,
        mem_mb=JOB_MEM_MB,
        runtime=lambda wildcards: preflight_runtime_min(SETTINGS, wildcards.name),
    conda:
        ENV
    shell:
        "{params.ctax} pipeline preflight check --config {input:q} --variant {wildcards.name:q}"
        " --out {output:q} --log-dir {params.log_dir:q} --placement {params.placement} 2>&1 | tee {log:q}"


rule preflight:
    input:
        expand(str(LAYOUT.preflight_ready("{name}")), name=VARIANTS),
    output:
        PREFLIGHT_STATUS,
    log:
        log_of("preflight"),
    params:
        ctax=CTAX,
    conda:
        ENV
    shell:
        "{params.ctax} pipeline preflight merge --out {output:q} {input:q} > {log:q} 2>&1"
