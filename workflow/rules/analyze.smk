# analyze: per-cell statistics, saturation, taxes, verdicts on H1-H6 (reads results/ only).
# figures: figures 1-8 from the same files, no server needed (skips are recorded with reasons).
# manifest: one row per configuration x phase, skips and failed cells included.

PHASE_INDEXES = [index_of(name, phase) for name in CONFIGS for phase in LAUNCH_PHASES]
ANALYSIS = LAYOUT.analysis


rule analyze:
    input:
        config=STUDY_CONFIG,
        runs=PHASE_INDEXES,
        reference=REFERENCE_RATES,
    output:
        [str(path) for path in ANALYSIS.outputs()],
    log:
        log_of("analyze"),
    params:
        ctax=CTAX,
        results=study_dir,
    conda:
        ENV
    shell:
        "{params.ctax} pipeline analyze {params.results:q} > {log:q} 2>&1"
        " || {{ tail -n 1 {log:q} >&2; exit 1; }}"


rule figures:
    input:
        rules.analyze.output,
        config=STUDY_CONFIG,
    output:
        str(ANALYSIS.figures_skipped),
    log:
        log_of("figures"),
    params:
        ctax=CTAX,
        results=study_dir,
    conda:
        ENV
    shell:
        "{params.ctax} pipeline analyze {params.results:q} --figures-only > {log:q} 2>&1"
        " || {{ tail -n 1 {log:q} >&2; exit 1; }}"


rule manifest:
    input:
        config=STUDY_CONFIG,
        runs=PHASE_INDEXES,
        preflight=PREFLIGHT_STATUS,
        figures=rules.figures.output,
    output:
        str(LAYOUT.manifest_md),
        str(LAYOUT.manifest_tsv),
    log:
        log_of("manifest"),
    params:
        ctax=CTAX,
    conda:
        ENV
    shell:
        "{params.ctax} pipeline manifest --config {input.config:q} > {log:q} 2>&1"
