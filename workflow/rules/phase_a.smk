# Phase A: per configuration, one server launch and the rate sweep at the Phase A shape.
# One rule per configuration, so each gets a priority from the seeded run order (the
# design's defence against thermal drift) while GPU jobs can still run side by side.
# params.plan names every cell and its fingerprint: a changed setting re-runs the job, which
# re-measures only the cells whose fingerprint changed. A job's output goes to its log and to
# snakemake's console (tee): its one-line outcome, and the reason it stopped even when the
# results disk is full and the log cannot be written.

for _rank, _name in enumerate(RUN_ORDER[PHASE_A]):

    rule:
        name:
            f"phase_a_{_name}"
        input:
            config=STUDY_CONFIG,
            preflight=PREFLIGHT_STATUS,
        output:
            index_of(_name, PHASE_A),
        log:
            log_of(f"phase_a_{_name}"),
        benchmark:
            str(LAYOUT.benchmark(f"phase_a_{_name}"))
        params:
            ctax=CTAX,
            name=_name,
            cpus=lease_cpus,
            placement=PLACEMENT,
            plan=job_params(STUDY_CONFIG, SETTINGS, _name, PHASE_A),
        threads: PHASE_THREADS
        priority: len(RUN_ORDER[PHASE_A]) - _rank
        resources:
            gpu=GPUS_PER_JOB,
            mem_mb=JOB_MEM_MB,
            runtime=phase_runtime(_name, PHASE_A),
        conda:
            ENV
        shell:
            "{params.ctax} pipeline phase --config {input.config:q} --variant {params.name:q}"
            " --phase phase_a"
            " --cpus {params.cpus} --placement {params.placement} 2>&1 | tee {log:q}"


rule phase_a:
    input:
        [index_of(name, PHASE_A) for name in VARIANTS],
