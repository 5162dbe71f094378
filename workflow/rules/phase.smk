# The phase jobs: per phase, variant and replicate, one server launch. Phase A sweeps the rates at
# its shape; Phase B runs every shape at ref_safe, and Phase B' (the priority variants on the
# priority shapes at ref_load, only when it differs from ref_safe) in the same launch. One rule per
# launch, so each gets a priority from the seeded, interleaved launch order (the defence against
# drift: with workload.replicates k, k rounds of every variant) while GPU jobs can still run side
# by side. A Phase B job waits for the reference checkpoint: its cells run at those rates.
# params.plan names every cell and its fingerprint: a changed setting re-runs the job, which
# re-measures only the cells whose fingerprint changed (its outputs: launch_outputs). A job's
# output goes to its log and to snakemake's console (tee): its one-line outcome, and the reason
# it stopped even when the results disk is full and the log cannot be written.

for _phase in LAUNCH_PHASES:
    for _rank, (_name, _rep) in enumerate(LAUNCH_ORDER[_phase]):

        rule:
            name:
                job_of(_phase, _name, _rep)
            input:
                config=STUDY_CONFIG,
                preflight=PREFLIGHT_STATUS,
                paired=paired_with(_name, _phase, _rep),
                reference=reference_input(_phase),
            output:
                launch_outputs(_name, _phase, _rep),
            log:
                log_of(job_of(_phase, _name, _rep)),
            benchmark:
                str(LAYOUT.benchmark(job_of(_phase, _name, _rep)))
            params:
                ctax=CTAX,
                name=_name,
                phase=_phase,
                replicate=_rep,
                cpus=lease_cpus,
                placement=PLACEMENT,
                plan=phase_plan(_name, _phase, _rep),
            threads: PHASE_THREADS
            priority: len(LAUNCH_ORDER[_phase]) - _rank
            resources:
                gpu=GPUS_PER_JOB,
                mem_mb=JOB_MEM_MB,
                runtime=phase_runtime(_name, _phase),
            conda:
                ENV
            shell:
                "{params.ctax} pipeline phase --config {input.config:q} --variant {params.name:q}"
                " --phase {params.phase} --replicate {params.replicate}"
                " --cpus {params.cpus} --placement {params.placement} 2>&1 | tee {log:q}"


rule phase_a:
    input:
        indexes_of(PHASE_A),


rule phase_b:
    input:
        indexes_of(PHASE_B),
