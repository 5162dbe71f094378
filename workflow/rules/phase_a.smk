# Phase A: per variant and replicate, one server launch and the rate sweep at the Phase A shape.
# One rule per launch, so each gets a priority from the seeded, interleaved launch order (the
# design's defence against thermal drift: with workload.replicates k, k rounds of every variant)
# while GPU jobs can still run side by side.
# params.plan names every cell and its fingerprint: a changed setting re-runs the job, which
# re-measures only the cells whose fingerprint changed (its outputs: launch_outputs). A job's
# output goes to its log and to snakemake's console (tee): its one-line outcome, and the reason
# it stopped even when the results disk is full and the log cannot be written.

for _rank, (_name, _rep) in enumerate(LAUNCH_ORDER[PHASE_A]):

    rule:
        name:
            job_of("phase_a", _name, _rep)
        input:
            config=STUDY_CONFIG,
            preflight=PREFLIGHT_STATUS,
            paired=paired_with(_name, PHASE_A, _rep),
        output:
            launch_outputs(_name, PHASE_A, _rep),
        log:
            log_of(job_of("phase_a", _name, _rep)),
        benchmark:
            str(LAYOUT.benchmark(job_of("phase_a", _name, _rep)))
        params:
            ctax=CTAX,
            name=_name,
            replicate=_rep,
            cpus=lease_cpus,
            placement=PLACEMENT,
            plan=job_params(STUDY_CONFIG, SETTINGS, _name, PHASE_A, _rep),
        threads: PHASE_THREADS
        priority: len(LAUNCH_ORDER[PHASE_A]) - _rank
        resources:
            gpu=GPUS_PER_JOB,
            mem_mb=JOB_MEM_MB,
            runtime=phase_runtime(_name, PHASE_A),
        conda:
            ENV
        shell:
            "{params.ctax} pipeline phase --config {input.config:q} --variant {params.name:q}"
            " --phase phase_a --replicate {params.replicate}"
            " --cpus {params.cpus} --placement {params.placement} 2>&1 | tee {log:q}"


rule phase_a:
    input:
        indexes_of(PHASE_A),
