"""`ctax analyze RESULTS_DIR [--figures] [...]`: the analysis of one study's results, with its
figures (the analysis computes, the plots draw; this command joins them, so that the analysis,
below the plots in the layers, never imports them). The rules `analyze`, `figures` and `report`
run it (`ctax analyze ...`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connector_tax.analysis.core import analyze, write_json_atomic, write_report
from connector_tax.analysis.usable_cells import StudyRefused
from connector_tax.arguments import unwritable
from connector_tax.commands.namespace import runs
from connector_tax.contract import StudyLayout
from connector_tax.contract.layout import AnalysisFiles
from connector_tax.plots import make_figures


def redraw_figures(analysis_dir: Path) -> dict[str, Any]:
    """Figures only, from an existing analysis/ folder (aggregate.json + hypotheses.json): draws
    figures/ (a notice for each one that cannot be drawn) and writes figures/skipped.json.
    Returns {"out_dir", "figures", "skipped_figures", "seconds"}."""
    t0 = time.perf_counter()
    out = AnalysisFiles(Path(analysis_dir))
    agg = json.loads(out.aggregate_json.read_text(encoding="utf-8"))
    hyp = json.loads(out.hypotheses_json.read_text(encoding="utf-8"))
    fig = make_figures(agg, hyp, out.figures)
    write_json_atomic(out.figures_skipped, fig["skipped"])
    return {
        "out_dir": str(out.folder),
        "figures": fig["made"],
        "skipped_figures": fig["skipped"],
        "seconds": round(time.perf_counter() - t0, 3),
    }


@dataclass(frozen=True)
class Args:
    """`ctax analyze`."""

    results_dir: Path
    figures: bool
    figures_only: bool
    report_only: bool
    baseline: str
    out: Path | None
    throughput_basis: str
    quiet: bool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results_dir", type=Path, metavar="RESULTS_DIR", help="results/<study>/ of one study")
    parser.add_argument(
        "--figures", action="store_true", help="also draw figures 1-8 (PNG + PDF) under analysis/figures/"
    )
    parser.add_argument(
        "--figures-only",
        action="store_true",
        help="redraw the figures from an existing RESULTS_DIR/analysis (or --out) without re-reading raw data",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="write report.md from an existing RESULTS_DIR/analysis (or --out) whose figures are drawn",
    )
    parser.add_argument(
        "--baseline",
        default="plain",
        help="config the taxes are measured against (default plain; 'first' = the study's first config)",
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder (default RESULTS_DIR/analysis)")
    parser.add_argument(
        "--throughput-basis",
        choices=["offered", "requested"],
        default="offered",
        help="saturation criterion 1 denominator: the rate offered in the window (default) or the requested rate",
    )
    parser.add_argument("--quiet", action="store_true", help="print only the output folder")
    runs(parser, Args, main)


def main(args: Args) -> int:
    results = Path(args.results_dir)
    if not results.is_dir():
        print(f"ctax analyze: {results}: no such directory", file=sys.stderr)
        return 2
    # Where it writes, checked before the analysis reads anything (a study is minutes of reading).
    target, flag = (Path(args.out), "--out") if args.out else (StudyLayout(results).analysis_dir, "analysis folder")
    if why := unwritable(target, flag, folder=True):
        print(f"ctax analyze: {why}", file=sys.stderr)
        return 2
    if args.figures_only:
        analysis_dir = Path(args.out) if args.out else StudyLayout(results).analysis_dir
        if not AnalysisFiles(analysis_dir).aggregate_json.is_file():
            print(
                f"ctax analyze: {analysis_dir}/aggregate.json missing: run without --figures-only first",
                file=sys.stderr,
            )
            return 2
        out = redraw_figures(analysis_dir)
        print(
            out["out_dir"]
            if args.quiet
            else f"figures: {len(out['figures'])} drawn, {len(out['skipped_figures'])} skipped in {out['seconds']:.1f} s"
        )
        return 0
    if args.report_only:
        analysis_dir = Path(args.out) if args.out else StudyLayout(results).analysis_dir
        if not AnalysisFiles(analysis_dir).figures_skipped.is_file():
            print(f"ctax analyze: {analysis_dir}/figures/skipped.json missing: draw the figures first", file=sys.stderr)
            return 2
        print(write_report(analysis_dir))
        return 0
    try:
        out = analyze(
            results,
            make_figures if args.figures else None,
            baseline=args.baseline,
            out_dir=args.out,
            throughput_basis=args.throughput_basis,
        )
    except StudyRefused as exc:
        print(f"ctax analyze: refused: {exc}", file=sys.stderr)
        return 2
    if args.quiet:
        print(out["out_dir"])
        return 0
    print(f"analysis written to {out['out_dir']} in {out['seconds']:.1f} s")
    print("verdicts: " + ", ".join(f"{k}={v}" for k, v in out["verdicts"].items()))
    if args.figures:
        print(f"figures: {len(out['figures'])} drawn, {len(out['skipped_figures'])} skipped")
        for name, reason in out["skipped_figures"].items():
            print(f"  skipped {name}: {reason}")
    return 0
