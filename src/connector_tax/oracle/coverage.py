"""Coverage of the analysis's intervals against the oracle's truth.

One "study" here is, per configuration and load, a short virtual-time cell (cells.py) of the
size a real study's cell has, each configuration on its own traffic (as separate cells are),
analysed with the analysis's own methods: the batch-means interval of each p90
(analysis/batchmeans.py), the taxes and their delta-method intervals (analysis/taxes.py,
quantiles.py) and the H1–H6 estimates and calls (analysis/estimates.py, hypotheses.py). Over
many seeds it counts how often each reported 95% interval covers the oracle's true value and
how often each call agrees with the true verdict. No HTTP and no load generator: this checks
the statistics, not the instruments (README.md says what a real run adds).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from connector_tax.analysis.batchmeans import percentile_ci
from connector_tax.config import Cell, find_variant
from connector_tax.oracle.cells import Latencies, run_cell, seed_for, study_loads
from connector_tax.oracle.truth import hypotheses_of, tax_estimates
from connector_tax.sim.settings import resolve


@dataclass(frozen=True)
class CoverageSettings:
    requests: int = 400  # measured requests per cell
    warmup_s: float | None = None  # None: the study's workload.warmup_s
    seeds: int = 20
    first_seed: int = 1000  # clear of the oracle's replication seeds
    jobs: int = 1


def cell_row(run: Latencies, config: str, load: Cell) -> dict[str, Any]:
    """A cell's row as cellstats gives it: p90s with their batch-means 95% intervals."""
    pair = load.pair
    row: dict[str, Any] = {
        "variant": config,
        "phase": load.phase,
        "cell": load.label,
        "rate": load.rate,
        "input_len": pair[0] if pair else None,
        "output_len": pair[1] if pair else None,
        "valid": True,
    }
    for m, values in (("ttft_ms", run.ttft_ms), ("tpot_ms", run.tpot_ms)):
        est, lo, hi = percentile_ci(values, 90)
        row.update(
            {
                f"{m}_p90": est,
                f"{m}_p90_ci_lo": lo,
                f"{m}_p90_ci_hi": hi,
                f"{m}_n": int(np.count_nonzero(~np.isnan(values))),
            }
        )
    return row


def _cell(job: tuple[dict[str, Any], str, Cell, int, CoverageSettings]) -> dict[str, Any]:
    config, name, load, seed, cs = job
    settings = resolve(config, find_variant(config, name), {})
    warmup_s = config["workload"]["warmup_s"] if cs.warmup_s is None else cs.warmup_s
    warmup = int(round(warmup_s * load.rate))
    run = run_cell(
        settings,
        load,
        warmup + cs.requests,
        seed_for(seed, load, 0, config=name),
        ignore_eos=config["workload"].get("ignore_eos", True),
    )
    return {"seed": seed, **cell_row(run.after(warmup), name, load)}


def _covers(ci: list[float] | None, value: float) -> bool | None:
    return None if not ci or None in ci else ci[0] <= value <= ci[1]


def score(rows: list[dict[str, Any]], truth: dict[str, Any]) -> dict[str, Any]:
    """One seed's study against the truth: per tax and per hypothesis, the estimate, its
    interval, whether the interval covers the true value and whether the call agrees."""
    names, reference = truth["variants"], truth["reference"]
    taxes, hyps = hypotheses_of(rows, names, reference)
    true_tax = {(t["variant"], t["cell"], t["metric"]): t["value"] for t in truth["taxes"]}
    out: dict[str, Any] = {"taxes": {}, "hypotheses": {}}
    for key, est in tax_estimates(taxes).items():
        if key in true_tax and est.get("value") is not None:
            out["taxes"]["/".join(key)] = {
                "value": est["value"],
                "ci": est.get("ci"),
                "covered": _covers(est.get("ci"), true_tax[key]),
            }
    for hid, h in hyps.items():
        t = truth["hypotheses"][hid]
        if h.get("value") is None or t.get("value") is None:
            continue
        out["hypotheses"][hid] = {
            "value": h["value"],
            "ci": h.get("ci"),
            "verdict": h["verdict"],
            "agrees": h["verdict"] == t["verdict"],
            "confidence": h.get("confidence"),
            "covered": _covers(h.get("ci"), t["value"]),
        }
    return out


def run_coverage(
    config: dict[str, Any], truth: dict[str, Any], cs: CoverageSettings, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """`cs.seeds` short studies at the truth's reference rates, each scored against it."""
    names, reference = truth["variants"], truth["reference"]
    seeds = range(cs.first_seed, cs.first_seed + cs.seeds)
    jobs = [
        (config, name, load, seed, cs)
        for seed in seeds
        for name in names
        for load in study_loads(config, name, reference)
    ]
    pool = ProcessPoolExecutor(cs.jobs) if cs.jobs > 1 else None
    try:
        rows = list(pool.map(_cell, jobs, chunksize=8) if pool else map(_cell, jobs))
    finally:
        if pool:
            pool.shutdown()
    per_seed = []
    for seed in seeds:
        per_seed.append(score([r for r in rows if r["seed"] == seed], truth))
        if progress and len(per_seed) % 10 == 0:
            progress(f"{len(per_seed)} of {cs.seeds} seeds scored")
    return {"settings": cs.__dict__, "seeds": per_seed, "summary": summarize(per_seed)}


def summarize(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Per quantity: how many seeds gave an interval, how many covered the truth, the median
    interval half-width; per hypothesis also how many calls agreed with the true verdict."""
    out: dict[str, Any] = {}
    for kind in ("taxes", "hypotheses"):
        keys = sorted({k for s in per_seed for k in s[kind]})
        table = {}
        for key in keys:
            entries = [s[kind][key] for s in per_seed if key in s[kind]]
            judged = [e["covered"] for e in entries if e["covered"] is not None]
            halves = [(e["ci"][1] - e["ci"][0]) / 2 for e in entries if e.get("ci") and None not in e["ci"]]
            table[key] = {
                "n": len(entries),
                "with_ci": len(judged),
                "covered": int(sum(judged)),
                "coverage": sum(judged) / len(judged) if judged else None,
                "median_half_width": float(np.median(halves)) if halves else None,
            }
            if kind == "hypotheses":
                table[key]["agrees"] = sum(e["agrees"] for e in entries)
                table[key]["confident"] = sum(e.get("confidence") == "confident" for e in entries)
        out[kind] = table
    return out
