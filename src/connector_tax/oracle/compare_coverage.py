"""Coverage of `ctax compare`'s intervals against the simulator's truth, launch bias on.

Per seed, two short virtual-time studies of a real study's cell size: A of one config, B of
another (a known injected difference: `inject`, e.g. Mooncake's connector costs doubled) or of
the same (the A/A pair: every true change is 0). Every variant is launched `replicates` times in
each study, each launch with its own speed factor (the simulator's per-launch bias), A's and B's
launches drawn apart (their launch seeds are tagged with the study) while both studies send the
same traffic per cell and replicate (one study seed: common random numbers across the studies,
as two runs of one config file have). Each pair is compared with the analysis's own code
(analysis/compare.py: the cell p90s paired by request across the studies, the taxes' launch-aware
intervals combined), and scored against the truth: the oracle's true p90s and taxes of each
config (truth.py), their ratio B / A - 1 the true change. Per quantity: how often the 95 %
interval covers the true change, the median half-width, the calls; for the quantities with a
true change, how often the call is "changed" on the right side (detected); for those without,
how often it is "changed" at all (a false change). No HTTP, no load generator: the statistics.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from connector_tax.analysis.compare import DEFAULT_MARGIN, LATENCIES, TAXES, latency_change, tax_change
from connector_tax.analysis.compare_sides import Cells
from connector_tax.analysis.constants import PLAIN
from connector_tax.config import StudyConfig
from connector_tax.config.merge import deep_merge
from connector_tax.oracle.coverage import CoverageSettings, launch_cell, with_launch_bias
from connector_tax.oracle.truth import TruthSettings, truth
from connector_tax.oracle.virtual_cells import seed_for, study_loads

STUDIES = ("A/", "B/")


@dataclass(frozen=True)
class CompareCoverageSettings:
    requests: int = 400  # measured requests per cell
    warmup_s: float | None = None  # None: the study's workload.warmup_s
    seeds: int = 20
    first_seed: int = 1000
    jobs: int = 1
    replicates: int = 2  # launches per variant in each study
    launch_bias_sd: float = 0.05  # the simulator's per-launch speed factor, sd of its log
    margin: float = DEFAULT_MARGIN


def inject(config: dict[str, Any], connector: str, scale: float) -> dict[str, Any]:
    """Study B's config: `connector`'s per-step costs (every hook, fixed and per request/block)
    times `scale`, as a connector release that got slower (or faster) would be."""
    out = copy.deepcopy(config)
    costs = (out.get("sim") or {}).get("connector_costs") or {}
    if connector not in costs:
        raise ValueError(f"sim.connector_costs has no {connector!r} ({', '.join(costs)})")
    scaled = {hook: {k: float(v) * scale for k, v in terms.items()} for hook, terms in costs[connector].items()}
    out["sim"] = deep_merge(out["sim"], {"connector_costs": {connector: scaled}})
    return out


def true_changes(truth_a: dict[str, Any], truth_b: dict[str, Any]) -> dict[tuple[str, str, str], float]:
    """{(variant, "phase/label", metric): the true B / A - 1} of every p90 and tax both truths hold."""
    out: dict[tuple[str, str, str], float] = {}
    cells_b = {(c["variant"], c["cell"]): c for c in truth_b["cells"]}
    for c in truth_a["cells"]:
        other = cells_b.get((c["variant"], c["cell"]))
        for metric, m in LATENCIES.items():
            if other and c.get(f"{m}_p90") and other.get(f"{m}_p90"):
                out[(c["variant"], c["cell"], metric)] = other[f"{m}_p90"] / c[f"{m}_p90"] - 1
    taxes_b = {(t["variant"], t["cell"], t["metric"]): t["value"] for t in truth_b["taxes"]}
    for t in truth_a["taxes"]:
        other = taxes_b.get((t["variant"], t["cell"], t["metric"]))
        if other is not None and t["metric"] in ("ttft_p90", "tpot_p90"):
            out[(t["variant"], t["cell"], "tax_" + t["metric"])] = (1 + other) / (1 + t["value"]) - 1
    return out


def _cells(results: list[dict[str, Any]]) -> Cells:
    rows = [r["row"] for r in results]
    series = {
        (r["row"]["variant"], r["row"]["phase"], r["row"]["cell"], r["row"]["replicate"]): r["series"] for r in results
    }
    # Both studies' cells of one (seed, load, replicate) sent the same requests (launch_cell's seed_for):
    # the traffic seed the pipeline would record.
    seeds = {key: r["traffic"] for key, r in zip(series, results)}
    return Cells(rows, series, seeds, PLAIN)


def _job(job: tuple[Any, ...]) -> dict[str, Any]:
    out = launch_cell(job[:-1])
    tag, traffic = job[-2:]
    out.update(study=tag, traffic=traffic)
    return out


def score(
    ca: Cells, cb: Cells, truth: dict[tuple[str, str, str], float], loads: dict[str, list[Any]], margin: float
) -> dict[str, Any]:
    """One seed's pair of studies against the true changes."""
    out: dict[str, Any] = {}
    for name, cells in loads.items():
        for load in cells:
            for metric in [*LATENCIES, *([] if name == PLAIN else TAXES)]:
                true = truth.get((name, load.key, metric))
                if true is None:
                    continue
                change = latency_change if metric in LATENCIES else tax_change
                row = change(ca, cb, name, name, load.phase, load.label, metric, margin)
                ci = None if row.ci_lo is None or row.ci_hi is None else [row.ci_lo, row.ci_hi]
                out[f"{name}/{load.key}/{metric}"] = {
                    "true": true,
                    "value": row.change,
                    "ci": ci,
                    "covered": None if ci is None else ci[0] <= true <= ci[1],
                    "call": row.call,
                    "launch_share": row.launch_share,
                }
    return out


def run_compare_coverage(
    study_a: StudyConfig,
    study_b: StudyConfig,
    truth_a: dict[str, Any],
    truth_b: dict[str, Any],
    cs: CompareCoverageSettings,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """`cs.seeds` pairs of short studies (A of study_a, B of study_b) at the truths' reference
    rates, each compared and scored against the true changes (truth_b is truth_a for an A/A pair)."""
    cov = CoverageSettings(requests=cs.requests, warmup_s=cs.warmup_s, launch_bias_sd=cs.launch_bias_sd)
    studies = {"A/": with_launch_bias(study_a, cov), "B/": with_launch_bias(study_b, cov)}
    names, reference = list(truth_a["variants"]), truth_a["reference"]
    loads = {name: study_loads(study_a, name, reference) for name in names}
    seeds = range(cs.first_seed, cs.first_seed + cs.seeds)
    jobs = [
        (studies[tag], name, load, seed, r, cov, tag, seed_for(seed, load, r))
        for seed in seeds
        for tag in STUDIES
        for name in names
        for load in loads[name]
        for r in range(1, cs.replicates + 1)
    ]
    pool = ProcessPoolExecutor(cs.jobs) if cs.jobs > 1 else None
    try:
        results = list(pool.map(_job, jobs, chunksize=4) if pool else map(_job, jobs))
    finally:
        if pool:
            pool.shutdown()
    truth = true_changes(truth_a, truth_b)
    per_seed = []
    for seed in seeds:
        mine = [c for c in results if c["seed"] == seed]
        ca = _cells([c for c in mine if c["study"] == "A/"])
        cb = _cells([c for c in mine if c["study"] == "B/"])
        per_seed.append({"seed": seed, "changes": score(ca, cb, truth, loads, cs.margin)})
        if progress and len(per_seed) % 10 == 0:
            progress(f"{len(per_seed)} of {cs.seeds} seeds scored")
    return {
        "settings": asdict(cs),
        "truth": {"/".join(k): v for k, v in truth.items()},
        "seeds": per_seed,
        "summary": summarize(per_seed),
    }


def check_pair(
    study: StudyConfig,
    reference: dict[str, float],
    names: list[str],
    injected: tuple[str, float] | None,
    ts: TruthSettings,
    cs: CompareCoverageSettings,
) -> dict[str, Any]:
    """The truths of A (`study`) and B (`study` with `injected` = (connector, cost scale), or
    the same study: an A/A pair), then the coverage of `cs.seeds` compared pairs."""
    truth_a = truth(study, reference, names, ts)
    study_b = study if injected is None else StudyConfig.from_mapping(inject(dict(study.raw), *injected))
    truth_b = truth_a if injected is None else truth(study_b, reference, names, ts)
    out = run_compare_coverage(study, study_b, truth_a, truth_b, cs)
    out["injected"] = None if injected is None else {"connector": injected[0], "cost_scale": injected[1]}
    return out


INJECTED = 1e-6  # a true change smaller than this is none (the truths share their traffic: exactly 0)


def summarize(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Per quantity: intervals, coverage, median half-width, calls; detection (a true change
    called "changed" on its side) or false changes (none, called "changed"); and overall."""
    table: dict[str, Any] = {}
    for key in sorted({k for s in per_seed for k in s["changes"]}):
        entries = [s["changes"][key] for s in per_seed if key in s["changes"]]
        judged = [e["covered"] for e in entries if e["covered"] is not None]
        halves = [(e["ci"][1] - e["ci"][0]) / 2 for e in entries if e["ci"]]
        true = entries[0]["true"]
        injected = abs(true) > INJECTED
        changed = [e for e in entries if e["call"] == "changed"]
        table[key] = {
            "true": true,
            "injected": injected,
            "n": len(entries),
            "with_ci": len(judged),
            "covered": int(sum(judged)),
            "coverage": sum(judged) / len(judged) if judged else None,
            "median_half_width": float(np.median(halves)) if halves else None,
            "calls": {c: sum(e["call"] == c for e in entries) for c in sorted({e["call"] for e in entries})},
            "detected": sum((e["value"] > 0) == (true > 0) for e in changed) if injected else None,
            "false_changes": None if injected else len(changed),
        }
    judged = sum(t["with_ci"] for t in table.values())
    covered = sum(t["covered"] for t in table.values())
    hit = [t for t in table.values() if t["injected"]]
    null = [t for t in table.values() if not t["injected"]]
    return {
        "changes": table,
        "overall": {
            "covered": covered,
            "with_ci": judged,
            "coverage": covered / judged if judged else None,
            "worst": min((t["coverage"] for t in table.values() if t["coverage"] is not None), default=None),
            "detected": sum(t["detected"] for t in hit),
            "injected": sum(t["n"] for t in hit),
            "detection": sum(t["detected"] for t in hit) / sum(t["n"] for t in hit) if hit else None,
            "worst_detection": min((t["detected"] / t["n"] for t in hit), default=None),
            "false_changes": sum(t["false_changes"] for t in null),
            "null": sum(t["n"] for t in null),
        },
    }
