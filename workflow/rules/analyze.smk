# analyze: per-cell statistics, saturation, taxes, verdicts on H1-H6 (reads results/ only).
# figures: figures 1-8 from the same files, no server needed (skips are recorded with reasons).
# manifest: one row per configuration x phase, skips included.

ANALYSIS = f"{RESULTS}/analysis"
PHASE_RUNS = expand(f"{RESULTS}/{{name}}/{{phase}}/run.json", name=CONFIGS, phase=["phase_a", "phase_b"])


rule analyze:
    input:
        runs=PHASE_RUNS,
        reference=REFERENCE_RATES,
    output:
        multiext(f"{ANALYSIS}/", "aggregate.json", "aggregate.csv", "hypotheses.json", "report.md"),
    log:
        f"{RESULTS}/logs/analyze.log",
    params:
        python=PYTHON,
        results=lambda wildcards, input: os.path.dirname(input.reference),
    conda:
        ENV
    shell:
        "{params.python} -m connector_tax.analysis.cli {params.results:q} > {log:q} 2>&1"


rule figures:
    input:
        rules.analyze.output,
    output:
        f"{ANALYSIS}/figures/skipped.json",
    log:
        f"{RESULTS}/logs/figures.log",
    params:
        python=PYTHON,
        results=lambda wildcards, input: os.path.dirname(os.path.dirname(input[0])),
    conda:
        ENV
    shell:
        "{params.python} -m connector_tax.analysis.cli {params.results:q} --figures-only > {log:q} 2>&1"


rule manifest:
    input:
        config=STUDY_CONFIG,
        runs=PHASE_RUNS,
        preflight=PREFLIGHT_STATUS,
        figures=rules.figures.output,
    output:
        f"{RESULTS}/MANIFEST.md",
        f"{RESULTS}/MANIFEST.tsv",
    log:
        f"{RESULTS}/logs/manifest.log",
    params:
        python=PYTHON,
        results=lambda wildcards, input: os.path.dirname(input.config),
    conda:
        ENV
    shell:
        "{params.python} -m connector_tax.pipeline.manifest --config {input.config:q}"
        " --results {params.results:q} > {log:q} 2>&1"
