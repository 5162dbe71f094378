# Phase B: per configuration, one server launch and every shape at ref_safe; Phase B'
# (the priority configurations on the priority shapes at ref_load, only when it differs
# from ref_safe) runs in the same launch. Its cells and fingerprints depend on the reference
# rates, so its params are computed once the reference checkpoint has run.


for _rank, _name in enumerate(RUN_ORDER[PHASE_B]):

    rule:
        name:
            f"phase_b_{_name}"
        input:
            config=STUDY_CONFIG,
            preflight=PREFLIGHT_STATUS,
            reference=reference_rates_checkpoint,
        output:
            index_of(_name, PHASE_B),
        log:
            log_of(f"phase_b_{_name}"),
        benchmark:
            str(LAYOUT.benchmark(f"phase_b_{_name}"))
        params:
            ctax=CTAX,
            name=_name,
            cpus=lease_cpus,
            placement=PLACEMENT,
            plan=phase_b_plan(_name),
        threads: PHASE_THREADS
        priority: len(RUN_ORDER[PHASE_B]) - _rank
        resources:
            gpu=GPUS_PER_JOB,
            mem_mb=JOB_MEM_MB,
            runtime=phase_runtime(_name, PHASE_B),
        conda:
            ENV
        shell:
            "{params.ctax} pipeline phase --config {input.config:q} --variant {params.name:q}"
            " --phase phase_b"
            " --cpus {params.cpus} --placement {params.placement} 2>&1 | tee {log:q}"


rule phase_b:
    input:
        [index_of(name, PHASE_B) for name in VARIANTS],
