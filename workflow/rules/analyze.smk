# analyze: per-cell statistics, saturation, taxes, verdicts on H1-H6 (reads results/ only).
# figures: figures 1-8 from the same documents, no server needed; every figure file is declared
# (one that cannot be drawn is a notice saying why) and goes into `snakemake --report`.
# report: report.md, once the figures exist. manifest: one row per configuration x phase.

from connector_tax.contract.layout import FIGURES

PHASE_INDEXES = [index for phase in LAUNCH_PHASES for index in indexes_of(phase)]
ANALYSIS = LAYOUT.analysis


rule analyze:
    input:
        config=STUDY_CONFIG,
        runs=PHASE_INDEXES,
        reference=REFERENCE_RATES,
    output:
        str(ANALYSIS.aggregate_json),
        str(ANALYSIS.aggregate_csv),
        str(ANALYSIS.aggregate_parquet),
        str(ANALYSIS.taxes_csv),
        str(ANALYSIS.taxes_parquet),
        str(ANALYSIS.hypotheses_json),
        report(str(ANALYSIS.verdicts_tsv), caption="../report/verdicts.rst", category="Verdicts"),
    log:
        log_of("analyze"),
    params:
        ctax=CTAX,
        results=study_dir,
    conda:
        ENV
    shell:
        "{params.ctax} analyze {params.results:q} > {log:q} 2>&1"
        " || {{ tail -n 1 {log:q} >&2; exit 1; }}"


rule figures:
    input:
        rules.analyze.output,
        config=STUDY_CONFIG,
    output:
        [report(str(ANALYSIS.figure(name, "png")), caption=f"../report/{name}.rst", category="Figures") for name in FIGURES],
        [str(ANALYSIS.figure(name, "pdf")) for name in FIGURES],
        skipped=str(ANALYSIS.figures_skipped),
    log:
        log_of("figures"),
    params:
        ctax=CTAX,
        results=study_dir,
    conda:
        ENV
    shell:
        "{params.ctax} analyze {params.results:q} --figures-only > {log:q} 2>&1"
        " || {{ tail -n 1 {log:q} >&2; exit 1; }}"


rule report:
    input:
        rules.figures.output,
        config=STUDY_CONFIG,
    output:
        str(ANALYSIS.report_md),
    log:
        log_of("report"),
    params:
        ctax=CTAX,
        results=study_dir,
    conda:
        ENV
    shell:
        "{params.ctax} analyze {params.results:q} --report-only > {log:q} 2>&1"
        " || {{ tail -n 1 {log:q} >&2; exit 1; }}"


rule manifest:
    input:
        config=STUDY_CONFIG,
        runs=PHASE_INDEXES,
        preflight=PREFLIGHT_STATUS,
        report=rules.report.output,
    output:
        report(str(LAYOUT.manifest_tsv), caption="../report/manifest.rst", category="Manifest"),
        str(LAYOUT.manifest_md),
    log:
        log_of("manifest"),
    params:
        ctax=CTAX,
    conda:
        ENV
    shell:
        "{params.ctax} pipeline manifest --config {input.config:q} > {log:q} 2>&1"
