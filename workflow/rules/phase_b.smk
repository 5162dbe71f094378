# Phase B: per variant and replicate, one server launch and every shape at ref_safe; Phase B'
# (the priority variants on the priority shapes at ref_load, only when it differs from
# ref_safe) runs in the same launch. Launches run in the seeded, interleaved launch order. Its cells and fingerprints depend on the reference
# rates, so its params are computed once the reference checkpoint has run.


for _rank, (_name, _rep) in enumerate(LAUNCH_ORDER[PHASE_B]):

    rule:
        name:
            job_of("phase_b", _name, _rep)
        input:
            config=STUDY_CONFIG,
            preflight=PREFLIGHT_STATUS,
            paired=paired_with(_name, PHASE_B, _rep),
            reference=reference_rates_checkpoint,
        output:
            launch_outputs(_name, PHASE_B, _rep),
        log:
            log_of(job_of("phase_b", _name, _rep)),
        benchmark:
            str(LAYOUT.benchmark(job_of("phase_b", _name, _rep)))
        params:
            ctax=CTAX,
            name=_name,
            replicate=_rep,
            cpus=lease_cpus,
            placement=PLACEMENT,
            plan=phase_b_plan(_name, _rep),
        threads: PHASE_THREADS
        priority: len(LAUNCH_ORDER[PHASE_B]) - _rank
        resources:
            gpu=GPUS_PER_JOB,
            mem_mb=JOB_MEM_MB,
            runtime=phase_runtime(_name, PHASE_B),
        conda:
            ENV
        shell:
            "{params.ctax} pipeline phase --config {input.config:q} --variant {params.name:q}"
            " --phase phase_b --replicate {params.replicate}"
            " --cpus {params.cpus} --placement {params.placement} 2>&1 | tee {log:q}"


rule phase_b:
    input:
        indexes_of(PHASE_B),
