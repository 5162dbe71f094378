"""Coverage of the analysis's intervals against the oracle's truth, launch bias included.

One "study" here is, per seed, every variant's short virtual-time cell (virtual_cells.py) of the size a
real study's cell has, at each of the study's loads, in `replicates` launches per variant. A
launch is an engine with its own speed factor (the simulator's per-launch bias,
`launch_bias_sd`; 1 when it is off), drawn from the launch's seed; every variant of a replicate
sees the same traffic (common random numbers, as the pipeline's cells do). Each study is analysed
twice, with the analysis's own code:

* **reference** (the analysis before launch-aware intervals): each variant's first launch only,
  the batch-means interval of each p90 (analysis/batchmeans.py) and the taxes' delta-method
  combination of two independent cells (analysis/quantiles.py);
* **launch** (analysis/launch_intervals.py): every launch, each replicate's tax paired by request
  against the baseline's, the launch-to-launch variance pooled over the variants (an A/A control,
  the baseline again, among them when `aa_control`).

Both are scored against the truth (the nominal engine: a launch's median): per tax and per
hypothesis, how often the 95% interval covers the true value, the median half-width, how often
the call agrees with the true verdict; an "inconclusive" where the truth makes a call is counted
as no call, not as a wrong one (`no_call`, `wrong`). No HTTP and no load generator: this checks the statistics,
not the instruments (README.md says what a real run adds).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from connector_tax.analysis import constants as K
from connector_tax.analysis.batchmeans import percentile_ci
from connector_tax.analysis.hypotheses import CALLED
from connector_tax.analysis.launch_intervals import Series, log_percentile_ci
from connector_tax.analysis.taxes import SeriesMap
from connector_tax.config import PHASE_A, Cell, StudyConfig
from connector_tax.config.cells import launch_seed
from connector_tax.oracle.truth import hypotheses_of, tax_estimates
from connector_tax.oracle.virtual_cells import Latencies, run_cell, seed_for, study_loads
from connector_tax.sim.settings import resolve

METHODS = ("reference", "launch")
AA = K.PLAIN + "_aa"


@dataclass(frozen=True)
class CoverageSettings:
    requests: int = 400  # measured requests per cell
    warmup_s: float | None = None  # None: the study's workload.warmup_s
    seeds: int = 20
    first_seed: int = 1000  # clear of the oracle's replication seeds
    jobs: int = 1
    replicates: int = 1  # launches per variant (the launch method's k; the reference uses the first)
    launch_bias_sd: float = 0.0  # the simulator's per-launch speed factor, sd of its log
    aa_control: bool = True  # the launch method's study has an A/A control (plain again)


def cell_row(run: Latencies, config: str, load: Cell, replicate: int = 1) -> dict[str, Any]:
    """A cell's row as the analysis makes it: p90s with the reference batch-means 95% intervals
    (`ci`), and the log-scale ones the launch method reports (`log_ci`)."""
    pair = load.pair
    row: dict[str, Any] = {
        "variant": config,
        "phase": load.phase,
        "cell": load.label,
        "replicate": replicate,
        "rate": load.rate,
        "input_len": pair[0] if pair else None,
        "output_len": pair[1] if pair else None,
        "valid": True,
    }
    for m, values in (("ttft_ms", run.ttft_ms), ("tpot_ms", run.tpot_ms)):
        est, lo, hi = percentile_ci(values, 90)
        _, log_lo, log_hi = log_percentile_ci(values, 90)
        row.update(
            {
                f"{m}_p90": est,
                f"{m}_p90_ci_lo": lo,
                f"{m}_p90_ci_hi": hi,
                f"{m}_p90_log_ci": [log_lo, log_hi],
                f"{m}_n": int(np.count_nonzero(~np.isnan(values))),
            }
        )
    return row


def with_launch_bias(study: StudyConfig, cs: CoverageSettings) -> StudyConfig:
    """The study with the simulator's per-launch speed spread of these coverage settings."""
    raw = copy.deepcopy(dict(study.raw))
    raw["sim"] = {**raw.get("sim", {}), "launch_bias_sd": cs.launch_bias_sd}
    return StudyConfig.from_mapping(raw)


def launch_cell(job: tuple[Any, ...]) -> dict[str, Any]:
    """One launch's cell: (study, variant, load, seed, replicate, settings[, study tag]); the tag
    gives two studies of one seed launches of their own (compare_coverage.py) and the same traffic."""
    study, name, load, seed, replicate, cs, *tag = job
    variant = study.variant(K.PLAIN if name == AA else name)
    settings = resolve(study, variant, {}, launch_seed(seed, "".join(tag) + name, PHASE_A, replicate))
    warmup_s = study.workload.warmup_s if cs.warmup_s is None else cs.warmup_s
    warmup = int(round(warmup_s * load.rps))
    run = run_cell(
        settings,
        load,
        warmup + cs.requests,
        seed_for(seed, load, replicate),  # common random numbers: one traffic per (seed, load, replicate)
        ignore_eos=study.workload.request.ignore_eos,
    ).after(warmup)
    row = cell_row(run, name, load, replicate)
    index = np.arange(run.ttft_ms.size)
    series = {"ttft_ms": Series(index, run.ttft_ms), "tpot_ms": Series(index, run.tpot_ms)}
    return {"seed": seed, "row": row, "series": series, "speed": settings.speed_factor}


def _covers(ci: list[float] | None, value: float) -> bool | None:
    return None if not ci or None in ci else ci[0] <= value <= ci[1]


def score(
    rows: list[dict[str, Any]],
    truth: dict[str, Any],
    series: SeriesMap | None = None,
    names: list[str] | None = None,
) -> dict[str, Any]:
    """One seed's study against the truth: per tax and per hypothesis, the estimate, its
    interval, whether the interval covers the true value and whether the call agrees. `series`
    (the cells' requests): the launch method's taxes; without it the reference method's."""
    names, reference = names or truth["variants"], truth["reference"]
    taxes, hyps = hypotheses_of(rows, names, reference, series=series)
    true_tax = {(t["variant"], t["cell"], t["metric"]): t["value"] for t in truth["taxes"]}
    out: dict[str, Any] = {"taxes": {}, "hypotheses": {}}
    for key, est in tax_estimates(taxes).items():
        true = 0.0 if key[0] == AA else true_tax.get(key)
        if true is not None and est.get("value") is not None:
            out["taxes"]["/".join(key)] = {
                "value": est["value"],
                "ci": est.get("ci"),
                "covered": _covers(est.get("ci"), true),
                "launch_share": est.get("launch_share"),
            }
    for hid, h in hyps.items():
        t = truth["hypotheses"][hid]
        if h.get("value") is None or t.get("value") is None:
            continue
        called, true_call = h["verdict"] in CALLED, t["verdict"] in CALLED
        out["hypotheses"][hid] = {
            "value": h["value"],
            "ci": h.get("ci"),
            "verdict": h["verdict"],
            "agrees": h["verdict"] == t["verdict"],
            # no call where the truth has one: not wrong, but not the answer either
            "no_call": not called and true_call,
            # a call the truth contradicts (a call where the truth has none is not counted)
            "wrong": called and true_call and h["verdict"] != t["verdict"],
            "confidence": h.get("confidence"),
            "covered": _covers(h.get("ci"), t["value"]),
        }
    return out


def run_coverage(
    study: StudyConfig, truth: dict[str, Any], cs: CoverageSettings, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """`cs.seeds` short studies at the truth's reference rates, each analysed by both methods and
    scored against the truth."""
    study = with_launch_bias(study, cs)
    names, reference = list(truth["variants"]), truth["reference"]
    launched = names + ([AA] if cs.aa_control else [])
    seeds = range(cs.first_seed, cs.first_seed + cs.seeds)
    jobs = [
        (study, name, load, seed, replicate, cs)
        for seed in seeds
        for name in launched
        for load in study_loads(study, K.PLAIN if name == AA else name, reference)
        for replicate in range(1, cs.replicates + 1)
    ]
    pool = ProcessPoolExecutor(cs.jobs) if cs.jobs > 1 else None
    try:
        cells = list(pool.map(launch_cell, jobs, chunksize=4) if pool else map(launch_cell, jobs))
    finally:
        if pool:
            pool.shutdown()
    per_seed: list[dict[str, Any]] = []
    for seed in seeds:
        mine = [c for c in cells if c["seed"] == seed]
        first = [c["row"] for c in mine if c["row"]["replicate"] == 1 and c["row"]["variant"] != AA]
        rows = [c["row"] for c in mine]
        series = {
            (c["row"]["variant"], c["row"]["phase"], c["row"]["cell"], c["row"]["replicate"]): c["series"] for c in mine
        }
        per_seed.append(
            {
                "seed": seed,
                "reference": score(first, truth),
                "launch": score(rows, truth, series, launched),
                "speeds": sorted({round(c["speed"], 4) for c in mine}),
            }
        )
        if progress and len(per_seed) % 10 == 0:
            progress(f"{len(per_seed)} of {cs.seeds} seeds scored")
    return {
        "settings": asdict(cs),
        "seeds": per_seed,
        "summary": {method: summarize([s[method] for s in per_seed]) for method in METHODS},
    }


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
            if kind == "taxes":
                shares = [e["launch_share"] for e in entries if e.get("launch_share") is not None]
                table[key]["median_launch_share"] = float(np.median(shares)) if shares else None
            if kind == "hypotheses":
                table[key]["agrees"] = sum(e["agrees"] for e in entries)
                table[key]["no_call"] = sum(e.get("no_call", False) for e in entries)
                table[key]["wrong"] = sum(e.get("wrong", False) for e in entries)
                table[key]["confident"] = sum(e.get("confidence") == "confident" for e in entries)
                table[key]["confident_wrong"] = sum(
                    e.get("wrong", False) and e.get("confidence") == "confident" for e in entries
                )
        out[kind] = table
    return out


def overall(summary: dict[str, Any], exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """All taxes together: covered / with an interval (the A/A control's own, `exclude`d or not)."""
    taxes = {k: t for k, t in summary["taxes"].items() if not k.startswith(exclude)} if exclude else summary["taxes"]
    judged = sum(t["with_ci"] for t in taxes.values())
    covered = sum(t["covered"] for t in taxes.values())
    return {
        "covered": covered,
        "with_ci": judged,
        "coverage": covered / judged if judged else None,
        "worst": min((t["coverage"] for t in taxes.values() if t["coverage"] is not None), default=None),
    }
