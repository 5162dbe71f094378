"""SIMULATED: what a short cell's p90 tax estimates: the tax (%) an n-request cell's p90s centre on,
beside the truth's tax at quantile levels 0.85-0.95.

Backs: ../docs/simulator.md#what-a-64-request-p90-estimates

For each variant of a study config at ref_safe (its Phase A cell), one long virtual-time run on
common random numbers (`--requests` measured requests after 200 discarded). Per tax (TTFT and
TPOT p90): the tax at quantile levels 0.85-0.95 (where it changes across that band, a cell's p90
is no estimate of the tax at exactly 0.9), and, for each `--cells` size n, the tax an n-request
cell's p90s centre on: with independent requests (the band: the expected sample p90s from the
order statistics, oracle/quantile_band.py) and with requests that share load as one cell's do (the
mean over the long run's consecutive n-request windows). A study's cells differ from the windows
by their start only (a fresh engine after `workload.warmup_s`).
With `--coverage FILE` (a `tax_coverage --json` of the same config and rate), that benchmark's
intervals are scored again against the band's tax at its own cell size, beside their coverage
of the truth: an interval that covers the band but not the point is centred where its cell's
p90 is, and the point is a sharp spot of the distribution. Virtual time: no server, no HTTP.

    ctax benchmark p90_band                                          # default study, 16 req/s
    ctax benchmark tax_coverage --arrival config --requests 64 --replicates 1 \\
        --launch-bias-sd 0 --no-aa-control --json /tmp/cov.json
    ctax benchmark p90_band --coverage /tmp/cov.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import REPO, parser, positive_float, positive_int, write_json

from connector_tax.analysis import constants as K
from connector_tax.config import StudyConfig, load_config
from connector_tax.oracle.coverage import CoverageSettings, launch_cell
from connector_tax.oracle.quantile_band import band_tax, point_tax, windowed_tax
from connector_tax.oracle.virtual_cells import study_loads

LEVELS = (0.85, 0.88, 0.90, 0.92, 0.95)
METRICS = ("ttft", "tpot")


def sizes(text: str) -> list[int]:
    """--cells: comma-separated cell sizes, each 2 or more requests."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 2 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers of 2 or more")
    return values


def long_runs(study: StudyConfig, names: list[str], rate: float, requests: int, seed: int) -> dict[str, Any]:
    """Each variant's TTFT and TPOT over one long run at `rate` (its Phase A cell), on the same traffic."""
    load = study_loads(study, K.PLAIN, {"ref_safe": rate, "ref_load": rate})[0]
    # 200 requests discarded first, as the truth's replications in tax_coverage.py.
    cs = CoverageSettings(requests=requests, warmup_s=200 / rate, seeds=1, launch_bias_sd=0.0, aa_control=False)
    out = {}
    for name in names:
        cell = launch_cell((study, name, load, seed, 0, cs))
        out[name] = {m: cell["series"][f"{m}_ms"].values for m in METRICS}
    return out


def tax_key(name: str, label: str, metric: str) -> str:
    """A tax's key as tax_coverage's JSON names it: variant/phase_a/cell/metric_p90."""
    return f"{name}/phase_a/{label}/{metric}_p90"


def coverage_doc(path: Path) -> dict[str, Any] | None:
    """The results of a tax_coverage --json, None when the file is not one."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))["results"]
        _ = [run["settings"]["requests"] for run in doc["coverage"].values()], doc["truth"]["taxes"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return doc


def rescore(doc: dict[str, Any], bands: dict[str, float], windows: dict[str, float]) -> dict[str, Any]:
    """A tax_coverage run's launch-method intervals against the band's tax at its cell size."""
    truth = {f"{t['variant']}/{t['cell']}/{t['metric']}": t["value"] for t in doc["truth"]["taxes"] if "cell" in t}
    out = {}
    for sd, run in doc["coverage"].items():
        n = run["settings"]["requests"]
        for key in sorted(run["seeds"][0]["launch"]["taxes"]):
            band = bands.get(f"{key}@{n}")
            if band is None:
                continue
            rows = [s["launch"]["taxes"][key] for s in run["seeds"] if s["launch"]["taxes"].get(key, {}).get("ci")]
            values = np.array([r["value"] for r in rows])
            cis = np.array([r["ci"] for r in rows])
            true = truth[key]
            half = (cis[:, 1] - cis[:, 0]) / 2
            covers = (cis[:, 0] <= true) & (true <= cis[:, 1])
            out[f"{key} (bias sd {sd})"] = {
                "cells": len(rows),
                "requests": n,
                "truth": true,
                "band": band,
                "windows": windows.get(f"{key}@{n}"),
                "mean_estimate": float(values.mean()),
                "sd_estimate": float(values.std()),
                "covers_truth": int(covers.sum()),
                "misses_truth_below": int((cis[:, 1] < true).sum()),
                "covers_band": int(((cis[:, 0] <= band) & (band <= cis[:, 1])).sum()),
                "median_half_width": float(np.median(half)),
                # the width is an estimate too: how far it spreads, and whether it shrinks with the estimate
                "half_width_p05_p95": [float(v) for v in np.percentile(half, [5, 95])],
                "corr_estimate_half_width": float(np.corrcoef(values, half)[0, 1]),
                "misses_half_width_median": float(np.median(half[~covers])) if (~covers).any() else None,
            }
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__)
    p.add_argument("--config", default=str(REPO / "configs" / "default.yaml"))
    p.add_argument("--ref-safe", type=positive_float, default=16.0, help="the Phase A rate (default 16)")
    p.add_argument("--variants", help="only these configurations, comma-separated (plain is always added)")
    p.add_argument("--requests", type=positive_int, default=50000, help="measured requests of each long run")
    p.add_argument("--cells", type=sizes, default=[64, 256, 2000], help="cell sizes (default 64,256,2000)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--coverage", type=Path, help="a tax_coverage --json to score again against the band")
    args = p.parse_args(argv)
    if not Path(args.config).is_file():
        p.error(f"argument --config: {args.config}: no such file")
    coverage = None
    if args.coverage is not None:
        coverage = coverage_doc(args.coverage)
        if coverage is None:
            p.error(f"argument --coverage: {args.coverage}: not a JSON written by tax_coverage --json")
        # the band at the coverage run's own cell size, whatever --cells says
        args.cells = sorted({*args.cells, *(run["settings"]["requests"] for run in coverage["coverage"].values())})
    if max(args.cells) > args.requests:
        p.error(
            f"argument --cells: a cell of {max(args.cells)} requests is longer than the --requests {args.requests} run"
        )
    config = load_config(args.config)
    config["workload"]["phase_b"] = None
    config["workload"]["phase_b_prime"] = None
    study = StudyConfig.from_mapping(config)
    names = [v.name for v in study.variants]
    if args.variants:
        asked = args.variants.split(",")
        unknown = [n for n in asked if n not in names]
        if unknown:
            p.error(f"argument --variants: {', '.join(unknown)}: not a variant of {args.config}")
        names = [K.PLAIN] + [n for n in asked if n != K.PLAIN]
    t0 = time.monotonic()
    label = study_loads(study, K.PLAIN, {"ref_safe": args.ref_safe, "ref_load": args.ref_safe})[0].label
    if coverage is not None and not any(
        tax_key(name, label, m) in run["seeds"][0]["launch"]["taxes"]
        for run in coverage["coverage"].values()
        for name in names
        for m in METRICS
    ):
        p.error(
            f"argument --coverage: {args.coverage}: none of its taxes is at {args.ref_safe:g} req/s of {args.config}"
        )
    runs = long_runs(study, names, args.ref_safe, args.requests, args.seed)
    print(
        f"SIMULATED p90 band: {args.config}, {args.ref_safe:g} req/s, one run of {args.requests} requests per "
        f"variant ({time.monotonic() - t0:.0f} s)\n"
    )
    for m in METRICS:
        x = runs[K.PLAIN][m]
        p50, p90, p99 = np.percentile(x, [50, 90, 99])
        distinct = np.unique(np.round(x, 4)).size / x.size  # 0.1 µs: the simulator's steps repeat exactly
        print(f"  plain {m.upper()}: p50 {p50:.3f} ms, p90 {p90:.3f}, p99 {p99:.3f}; {distinct:.1%} distinct values")
    print()
    head = " ".join(f"q={q:.2f}" for q in LEVELS)
    cells = " ".join(f"n={n:<5d}" for n in args.cells)
    print(f"  {'':<42} {'':<{len(head)}}   {'a cell p90 centres on:':<{len(cells)}}")
    print(f"  {'':<42} {'':<{len(head)}}   {'independent requests':<{len(cells)}}   shared load (windows)")
    print(f"  {'tax (%)':<42} {head}   {cells}   {cells}")
    rows, bands, windows = {}, {}, {}
    base = runs[K.PLAIN]
    for name in names[1:]:
        for m in METRICS:
            key = tax_key(name, label, m)
            at = {q: point_tax(runs[name][m], base[m], q) for q in LEVELS}
            band = {n: band_tax(runs[name][m], base[m], n) for n in args.cells}
            window = {n: windowed_tax(runs[name][m], base[m], n) for n in args.cells}
            bands.update({f"{key}@{n}": v for n, v in band.items()})
            windows.update({f"{key}@{n}": v for n, v in window.items()})
            rows[key] = {"at_level": {f"{q:.2f}": v for q, v in at.items()}, "cell_centre": band, "windows": window}
            print(
                f"  {key:<42} "
                + " ".join(f"{100 * v:6.2f}" for v in at.values())
                + "   "
                + " ".join(f"{100 * v:7.2f}" for v in band.values())
                + "   "
                + " ".join(f"{100 * v:7.2f}" for v in window.values())
            )
    results: dict[str, Any] = {"config": args.config, "rate": args.ref_safe, "requests": args.requests, "taxes": rows}
    if coverage is not None:
        scored = rescore(coverage, bands, windows)
        print(f"\n  {args.coverage}: launch-method intervals against the truth and against the band at their cell size")
        for key, s in scored.items():
            print(
                f"  {key:<58} truth {100 * s['truth']:7.2f} %  band {100 * s['band']:7.2f} %  windows {100 * s['windows']:7.2f} %"
                f"  mean {100 * s['mean_estimate']:7.2f} %"
                f" (sd {100 * s['sd_estimate']:.2f} pp)  covers truth {s['covers_truth']:3d}/{s['cells']}"
                f" ({s['misses_truth_below']} misses below)  band {s['covers_band']:3d}/{s['cells']}"
                f"  half-width {100 * s['median_half_width']:.1f} pp"
            )
            lo, hi = s["half_width_p05_p95"]
            missed = s["misses_half_width_median"]
            print(
                f"  {'':<58} half-widths {100 * lo:.1f}-{100 * hi:.1f} pp (5th-95th percentile),"
                f" r(estimate, half-width) {s['corr_estimate_half_width']:.2f}"
                + ("" if missed is None else f", the misses' median half-width {100 * missed:.1f} pp")
            )
        results["coverage"] = scored
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
