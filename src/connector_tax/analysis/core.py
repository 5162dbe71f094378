"""The analysis entry point: results/<study>/ -> results/<study>/analysis/.

analyze() reads every cell once (requests, summary, metrics, step log), builds the tidy rows,
applies the saturation criteria, takes the reference rates (those in reference_rates.json,
which Phase B actually ran at, or recomputed when the file is absent), computes the taxes
against the baseline, reaches the verdicts, draws the figures and writes everything
atomically (temporary file in the same folder, then rename). The figures are drawn by the
`draw` it is handed (plots.make_figures, from the pipeline above it).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from connector_tax.analysis.artifacts import check_artifacts, runtime_of
from connector_tax.analysis.cellstats import cell_row
from connector_tax.analysis.columns import COLUMNS
from connector_tax.analysis.constants import PLAIN
from connector_tax.analysis.contention import study_contention
from connector_tax.analysis.hypotheses import evaluate
from connector_tax.analysis.intervention_effects import effects as intervention_effects
from connector_tax.analysis.launch_intervals import METHOD as LAUNCH_METHOD
from connector_tax.analysis.launch_intervals import P90_METHOD
from connector_tax.analysis.launches import like_for_like
from connector_tax.analysis.quantiles import CDF_PERCENTILES, TAX_CI_METHOD
from connector_tax.analysis.reference_rates import reference_from_rows
from connector_tax.analysis.report import render_report
from connector_tax.analysis.saturation import apply_to_row, cell_criteria, phase_a_saturation_by_launch
from connector_tax.analysis.tables import write_tables
from connector_tax.analysis.taxes import LaunchTaxes, SeriesMap, compute_taxes
from connector_tax.analysis.thread_cpu import thread_tables
from connector_tax.analysis.usable_cells import Study, load_study, phase_completed
from connector_tax.atomic import write_atomic
from connector_tax.config import PHASE_A
from connector_tax.contract import StudyLayout
from connector_tax.contract.layout import FIGURES, AnalysisFiles, phase_folder

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3  # 3: `variant` for what was `config`


# --------------------------------------------------------------------------- atomic writes


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf -> None, tuples -> lists, numpy scalars -> Python."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json_atomic(path: Path, doc: Any) -> None:
    write_atomic(path, json.dumps(_clean(doc), indent=2, allow_nan=False) + "\n")


# --------------------------------------------------------------------------- analysis


def _resolve_baseline(study: Study, baseline: str | None) -> tuple[str | None, bool]:
    """(baseline config or None, whether it was asked for explicitly)."""
    if baseline in (None, "", PLAIN):
        return (PLAIN if PLAIN in study.variants else None), False
    if baseline == "first":
        return (study.variants[0] if study.variants else None), True
    return (baseline if baseline in study.variants else None), True


def _reference(study: Study, computed: dict[str, Any]) -> dict[str, Any]:
    ref = dict(computed)
    ref["source"] = "computed"
    filed = study.reference_file if isinstance(study.reference_file, dict) else None
    if filed:
        ref["source"] = "reference_rates.json"
        for key in ("ref_safe_perturbed", "ref_load_perturbed"):
            if key in filed:
                ref[key] = filed[key]
        for key in ("ref_safe", "ref_load"):
            if key in filed and filed[key] != computed.get(key):
                ref["notes"] = list(ref.get("notes") or []) + [
                    f"{key}: reference_rates.json says {filed[key]}, recomputation gives {computed.get(key)}; "
                    "the file's value is used (the later phases ran at it)"
                ]
            if key in filed:
                ref[key] = filed[key]
                ref[f"{key}_flagged"] = filed.get(f"{key}_flagged", ref.get(f"{key}_flagged"))
                ref[f"{key}_reason"] = filed.get(f"{key}_reason", ref.get(f"{key}_reason"))
    return ref


def served_by(study: Study) -> str:
    """What served the study's launches, as their run.json indexes recorded it (e.g. "vLLM 0.32.0
    on CPU, dummy weights"); the backend's name for indexes written before they recorded it."""
    found = sorted({str(r.run["served_by"]) for r in study.runs.values() if r.run and r.run.get("served_by")})
    if found:
        return " and ".join(found)
    return "simulated vLLM (ctax sim)" if study.simulated else f"backend {study.backend}"


def launch_facts(study: Study) -> dict[str, Any]:
    """What the launches recorded beside their cells, for every output: the connector packages of
    the server's Python, the interventions each configuration declared, by name and in the words
    of their disclosures (run.json `interventions`, `workarounds`), whether each launch was seen
    applying them (`interventions_seen`), which LMCache mode it ran and the sidecars its launch started."""
    from connector_tax.contract.records import connector_packages

    packages = sorted(
        {connector_packages(r.run.get("server_versions") or {}) for r in study.runs.values() if r.run} - {""}
    )
    workarounds: dict[str, list[str]] = {}
    interventions: dict[str, list[str]] = {}
    modes: dict[str, str] = {}
    sidecars: dict[str, list[str]] = {}
    seen: dict[str, list[str]] = {}
    for (name, *_), r in study.runs.items():
        run = r.run or {}
        for iv in run.get("interventions") or []:
            says = ((run.get("interventions_seen") or {}).get(iv) or {}).get("says") or "declared, not checked"
            line = f"{run.get('phase')} (launch {run.get('replicate') or 1}): `{iv}` {says}"
            if line not in seen.setdefault(name, []):
                seen[name].append(line)
        for key, into in (("workarounds", workarounds), ("interventions", interventions)):
            for w in (r.run or {}).get(key) or []:
                if w not in into.setdefault(name, []):
                    into[name].append(w)
        if mode := (r.run or {}).get("lmcache_mode"):
            modes[name] = mode
        for side in (r.run or {}).get("sidecars") or []:
            what = f"{side.get('name')}: {side.get('label') or side.get('what')}"
            if what not in sidecars.setdefault(name, []):
                sidecars[name].append(what)
    return {
        "connector_packages": "; ".join(packages) or None,
        "workarounds": {k: v for k, v in workarounds.items() if v},
        "interventions": {k: v for k, v in interventions.items() if v},
        "interventions_seen": seen,
        "lmcache_modes": modes,
        "sidecars": {k: v for k, v in sidecars.items() if v},
    }


def read_cells(study: Study) -> tuple[list[dict[str, Any]], dict[str, dict[str, list[float]]], SeriesMap]:
    """Every usable cell read once: its aggregate row, the first launches' step CDF grids, and
    the requests the taxes pair launch by launch (`ctax compare` reads studies through it too)."""
    rows: list[dict[str, Any]] = []
    step_cdf: dict[str, dict[str, list[float]]] = {}
    series: SeriesMap = {}
    for cell in study.cells():
        run = study.run_of(cell.variant, cell.phase, cell.replicate)
        row, grid = cell_row(
            cell,
            backend=study.backend,
            simulated=study.simulated,
            run_status=run.status if run else "missing",
            step_timing_available=run.step_timing_available if run else False,
            series=series.setdefault((cell.variant, cell.phase, cell.label, cell.replicate), {}),
        )
        rows.append(row)
        if grid is not None and cell.replicate == 1:
            step_cdf.setdefault(cell.variant, {})[cell.key] = grid
    return rows, step_cdf, series


def build(results_dir: Path, baseline: str | None = PLAIN, throughput_basis: str = "offered") -> dict[str, Any]:
    """Everything the outputs are made of, in memory (no file written)."""
    t0 = time.perf_counter()
    study = load_study(Path(results_dir))
    rows, step_cdf, series = read_cells(study)
    base, _explicit = _resolve_baseline(study, baseline)
    thresholds = study.settings.saturation
    completed = {name: phase_completed(study, name, PHASE_A)[1] for name in study.variants}
    computed = reference_from_rows(
        rows,
        study.variants,
        completed,
        study.phase_a_rates,
        thresholds,
        baseline=base or PLAIN,
        basis=throughput_basis,
        simulated=study.simulated,
    )
    reference = _reference(study, computed)
    per_launch = phase_a_saturation_by_launch(rows, thresholds, throughput_basis)
    for row in rows:
        if row["phase"] == PHASE_A and row.get("rate") is not None:
            sat = per_launch.get((row["variant"], int(row.get("replicate") or 1)), {}).get(float(row["rate"]))
            if sat:
                apply_to_row(row, sat)
        else:
            apply_to_row(row, cell_criteria(row, thresholds, throughput_basis))
    taxes = compute_taxes(rows, study.variants, base, reference, series) if base else None
    # what each declared intervention explains, against the same variant without it
    effects = intervention_effects([v.raw for v in study.settings.variants], LaunchTaxes(series, rows), taxes)
    for entry in ((taxes or {}).get("phase_a") or {}).values():  # a skipped configuration: say why
        for name in entry.get("missing") or {}:
            pf = study.preflight.get(name) or {}
            if pf.get("status") == "skip":
                entry["missing"][name] = f"SKIP at preflight: {pf.get('reason')}"
    artifacts = check_artifacts(study)
    runtime = runtime_of(study)
    hypotheses = evaluate(taxes or {}, reference, study.variants, base, artifacts, runtime, study.simulated, rows)
    config_status = {}
    for name in study.variants:
        pf = study.preflight.get(name) or {}
        config_status[name] = {
            "preflight": pf.get("status"),
            "preflight_reason": pf.get("reason") or pf.get("note"),
            "phases": {
                phase_folder(ph, rep): {
                    "status": r.status,
                    "reason": r.reason,
                    "step_timing_available": r.step_timing_available,
                    "step_timing_reason": r.step_timing_reason,
                    "cells": [c.label for c in r.cells],
                    "not_analysed": r.problems,
                    "pruned": r.pruned,
                }
                for (n, ph, rep), r in study.runs.items()
                if n == name and (r.run is not None or r.problems)
            },
        }
    aggregate = {
        "schema_version": SCHEMA_VERSION,
        "study": study.name,
        "results_dir": str(study.root),
        "backend": study.backend,
        "simulated": study.simulated,
        "served_by": served_by(study),
        "variants": study.variants,
        "baseline": base,
        "baseline_requested": baseline,
        "connector_study": base == PLAIN,
        "variant_status": config_status,
        "ignored": study.ignored,
        "like_for_like": like_for_like(study),
        **launch_facts(study),
        # where a real server's CPU goes (the simulator's threads say nothing about vLLM's)
        "threads": thread_tables(study, reference) if study.backend == "vllm" else None,
        "code": study.code,
        "replicates": study.replicates,
        "aa_controls": study.settings.aa_controls,
        "ci_method": {
            "percentiles": P90_METHOD,
            "taxes": LAUNCH_METHOD if base else TAX_CI_METHOD,
            "itl": "ITL percentiles come from the load generator's summary (gaps are not in the records): no CI",
        },
        "saturation": {"thresholds": asdict(thresholds), "throughput_basis": throughput_basis},
        "columns": COLUMNS,
        "rows": rows,
        "reference": reference,
        "taxes": taxes,
        "intervention_effects": effects,
        "step_cdf": {"percentiles": [float(p) for p in CDF_PERCENTILES], "variants": step_cdf},
        "artifacts": artifacts,
        "runtime": runtime,
        "contention": study_contention(rows),
        "analysis_seconds": None,
    }
    aggregate["analysis_seconds"] = round(time.perf_counter() - t0, 3)
    return {"aggregate": aggregate, "hypotheses": hypotheses}


# Draws the figures of (aggregate, hypotheses) into a folder: {"made": {name: [paths]},
# "skipped": {name: why}}. The plots package gives one (plots.make_figures); the analysis,
# below it, only calls what it is handed.
Draw = Callable[[dict[str, Any], dict[str, Any], Path], dict[str, Any]]


def analyze(
    results_dir: Path,
    draw: Draw | None = None,
    *,
    baseline: str | None = PLAIN,
    out_dir: Path | None = None,
    throughput_basis: str = "offered",
) -> dict[str, Any]:
    """Analyse results/<study>/ and write analysis/{aggregate.json,aggregate.csv/.parquet,taxes.csv/.parquet,hypotheses.json,
    report.md} there (or in out_dir), and figures/ when `draw` is given. Returns {"out_dir",
    "files", "figures", "skipped_figures", "verdicts", "seconds"}.

    baseline: the variant taxes are measured against ("plain"; "first" = the study's first
    variant; any variant name). Without it in the study only the generic parts are produced."""
    figures = draw is not None
    t0 = time.perf_counter()
    results_dir = Path(results_dir)
    out = AnalysisFiles(Path(out_dir) if out_dir is not None else StudyLayout(results_dir).analysis_dir)
    built = build(results_dir, baseline=baseline, throughput_basis=throughput_basis)
    agg, hyp = built["aggregate"], built["hypotheses"]
    made: dict[str, list[str]] = {}
    skipped: dict[str, str] = {}
    if draw is not None:
        fig = draw(agg, hyp, out.figures)
        made, skipped = fig["made"], fig["skipped"]
        write_json_atomic(out.figures_skipped, skipped)
    write_json_atomic(out.aggregate_json, agg)
    write_tables(agg, out.aggregate_csv, out.aggregate_parquet, out.taxes_csv, out.taxes_parquet)
    write_json_atomic(out.hypotheses_json, hyp)
    write_atomic(out.verdicts_tsv, verdicts_tsv(hyp))
    write_atomic(out.report_md, render_report(agg, hyp, made, skipped, figures_made=figures))
    files = [p.name for p in out.outputs()] + [out.report_md.name]
    if figures:
        files += ["figures/skipped.json"] + [str(Path("figures") / Path(p).name) for ps in made.values() for p in ps]
    verdicts = {h["id"]: h["verdict"] for h in hyp["hypotheses"]}
    verdicts.update({s["id"]: s["status"] for s in hyp["success_criteria"]})
    return {
        "out_dir": str(out.folder),
        "files": files,
        "figures": made,
        "skipped_figures": skipped,
        "verdicts": verdicts,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def write_report(analysis_dir: Path) -> Path:
    """report.md from an analysis/ folder whose figures are drawn (figures/skipped.json)."""
    out = AnalysisFiles(Path(analysis_dir))
    agg = json.loads(out.aggregate_json.read_text(encoding="utf-8"))
    hyp = json.loads(out.hypotheses_json.read_text(encoding="utf-8"))
    skipped = json.loads(out.figures_skipped.read_text(encoding="utf-8"))
    made = {name: [str(out.figure(name, ext)) for ext in ("png", "pdf")] for name in FIGURES if name not in skipped}
    write_atomic(out.report_md, render_report(agg, hyp, made, skipped))
    return out.report_md


def verdicts_tsv(hyp: dict[str, Any]) -> str:
    """The verdict table (H1-H6, then the success criteria) as TSV, for Snakemake's report."""
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter="\t", lineterminator="\n")
    writer.writerow(["id", "verdict or status", "95% interval", "outcome", "why"])
    for h in hyp["hypotheses"]:
        writer.writerow([h["id"], h["verdict"], h.get("confidence") or "", "", h["reason"]])
    for c in hyp["success_criteria"]:
        writer.writerow([c["id"], c["status"], c.get("confidence") or "", c.get("outcome") or "", c["reason"]])
    return buf.getvalue()
