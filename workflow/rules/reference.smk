# Reference rates: a checkpoint after every Phase A job — saturation per cell by the study's
# three criteria (with which fired; docs/study-design.md), then ref_safe and ref_load. A
# checkpoint, so that the Phase B jobs (whose cells run at these rates) are planned only once the
# rates exist.


checkpoint reference:
    input:
        config=STUDY_CONFIG,
        runs=indexes_of(PHASE_A),
    output:
        REFERENCE_RATES,
    log:
        log_of("reference"),
    params:
        ctax=CTAX,
    conda:
        ENV
    shell:
        "{params.ctax} pipeline reference --config {input.config:q} > {log:q} 2>&1"
