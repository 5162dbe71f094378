"""The truth oracle: what the simulated study SHOULD find, from the simulator's own model.

The simulator knows every configuration's cost model, so the true p90 TTFT and TPOT of a
configuration at a load (its steady state under the study's arrival process and shape) can be
computed to any precision by running the engine in virtual time long enough (virtual_cells.py). From
those p90s the analysis's own code (taxes.compute_taxes, the RULES of hypotheses.py) gives the
true taxes and the true answers of H1–H6: no threshold is restated here.

Method: independent replications. Replication r of a load runs `requests` requests (after
`warmup` discarded ones, so each starts from an empty engine and is measured in steady state)
with seed (study seed, load, r), the same for every configuration (common random numbers). The
estimate of a p90 is the p90 of all replications' requests pooled; its 95% interval is a
Student-t interval from the spread of the replications' own p90s. Every derived number (a tax,
a hypothesis value) is computed on the pooled p90s, and its interval from the spread of the same
number computed replication by replication — paired across configurations, so the shared
traffic cancels. Replications are added (doubling) until every p90's relative half-width is at
most `precision`, or `max_replications` is reached; what was reached is reported either way.
A ratio (H3, H4) over a tax whose replication interval covers 0 has no true call either
("inconclusive", below the oracle's resolution), as the analysis judges a study's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from connector_tax.analysis import constants as K
from connector_tax.analysis.batchmeans import t975
from connector_tax.analysis.estimates import Taxes
from connector_tax.analysis.hypotheses import RULES, Rule, judge
from connector_tax.analysis.taxes import SeriesMap, compute_taxes
from connector_tax.config import PHASE_A, PHASE_B, PHASE_B_PRIME, Cell, StudyConfig
from connector_tax.oracle.virtual_cells import run_cell, seed_for, study_loads
from connector_tax.sim.settings import resolve

METRICS = ("ttft_ms", "tpot_ms")


@dataclass(frozen=True)
class TruthSettings:
    requests: int = 5000  # measured requests per replication
    warmup: int = 500  # requests discarded at the start of each replication
    precision: float = 0.01  # target relative half-width of every p90 (95%)
    min_replications: int = 4
    max_replications: int = 64
    seed: int = 0
    jobs: int = 1


@dataclass
class Series:
    """One (configuration, load): its replications' p90s and all their requests."""

    variant: str
    load: Cell
    p90s: dict[str, list[float]] = dataclasses.field(default_factory=lambda: {m: [] for m in METRICS})
    samples: dict[str, list[np.ndarray]] = dataclasses.field(default_factory=lambda: {m: [] for m in METRICS})

    def value(self, metric: str) -> float:
        pooled = np.concatenate(self.samples[metric])
        return float(np.nanpercentile(pooled, 90))

    def half_width(self, metric: str) -> float:
        reps = np.asarray(self.p90s[metric])
        return t975(len(reps) - 1) * float(reps.std(ddof=1)) / math.sqrt(len(reps)) if len(reps) > 1 else math.inf


def _replicate(
    job: tuple[StudyConfig, str, Cell, int, TruthSettings],
) -> tuple[str, str, int, dict[str, np.ndarray]]:
    study, name, load, rep, ts = job
    settings = resolve(study, study.variant(name), {})
    run = run_cell(
        settings,
        load,
        ts.warmup + ts.requests,
        seed_for(ts.seed, load, rep),
        ignore_eos=study.workload.request.ignore_eos,
    ).after(ts.warmup)
    return name, load.key, rep, {"ttft_ms": run.ttft_ms.astype(np.float32), "tpot_ms": run.tpot_ms.astype(np.float32)}


def simulate(
    study: StudyConfig,
    reference: dict[str, float],
    variants: list[str],
    ts: TruthSettings,
    progress: Callable[[str], None] | None = None,
) -> dict[tuple[str, str], Series]:
    """Replicate every (configuration, load) of the study until the precision is reached."""
    series = {(name, load.key): Series(name, load) for name in variants for load in study_loads(study, name, reference)}
    done, target = 0, min(ts.min_replications, ts.max_replications)
    pool = ProcessPoolExecutor(ts.jobs) if ts.jobs > 1 else None
    try:
        while True:
            jobs = [(study, s.variant, s.load, r, ts) for s in series.values() for r in range(done, target)]
            results = pool.map(_replicate, jobs) if pool else map(_replicate, jobs)
            for name, key, _rep, arrays in sorted(results, key=lambda x: x[2]):
                s = series[(name, key)]
                for m in METRICS:
                    s.samples[m].append(arrays[m])
                    s.p90s[m].append(float(np.nanpercentile(arrays[m], 90)))
            done = target
            worst = max(s.half_width(m) / s.value(m) for s in series.values() for m in METRICS)
            if progress:
                progress(f"{done} replications x {ts.requests} requests: worst p90 half-width {worst:.2%}")
            if worst <= ts.precision or done >= ts.max_replications:
                return series
            target = min(2 * done, ts.max_replications)
    finally:
        if pool:
            pool.shutdown()


def _row(s: Series, p90: dict[str, float], n: int) -> dict[str, Any]:
    pair = s.load.pair
    row: dict[str, Any] = {
        "variant": s.variant,
        "phase": s.load.phase,
        "cell": s.load.label,
        "rate": s.load.rate,
        "input_len": pair[0] if pair else None,
        "output_len": pair[1] if pair else None,
        "valid": True,
    }
    for m in METRICS:
        row.update({f"{m}_p90": p90[m], f"{m}_p90_ci_lo": None, f"{m}_p90_ci_hi": None, f"{m}_n": n})
    return row


def hypotheses_of(
    rows: list[dict[str, Any]],
    variants: list[str],
    reference: dict[str, float],
    cis: dict[str, list[float]] | None = None,
    series: SeriesMap | None = None,
    tax_cis: dict[tuple[str, str, str], list[float] | None] | None = None,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The analysis's taxes and H1–H6 judgements of cell rows (cellstats' columns); `cis`, when
    given, replace the estimates' intervals and `tax_cis` the taxes' (the oracle's come from its
    replications: whether a ratio's denominator is resolved is then the oracle's to say);
    `series` (the cells' requests) gives the taxes intervals that include the launch."""
    taxes = compute_taxes(rows, variants, K.PLAIN, reference, series)
    if tax_cis is not None:
        for key, est in tax_entries(taxes):
            est["ci"] = tax_cis.get(key)
    rules = RULES if cis is None else [_with_ci(rule, cis.get(rule.id)) for rule in RULES]
    return taxes, {rule.id: judge(rule, Taxes(taxes), variants, K.PLAIN) for rule in rules}


def _with_ci(rule: Rule, ci: list[float] | None) -> Rule:
    def estimate(t: Taxes) -> dict[str, Any] | None:
        est = rule.estimate(t)
        return None if est is None else {**est, "ci": ci}

    return dataclasses.replace(rule, estimate=estimate)


def _interval(value: float, reps: list[float | None]) -> list[float] | None:
    arr = np.asarray([r for r in reps if r is not None and math.isfinite(r)])
    if arr.size < 2:
        return None
    half = t975(arr.size - 1) * float(arr.std(ddof=1)) / math.sqrt(arr.size)
    return [value - half, value + half]


def tax_entries(taxes: dict[str, Any]) -> list[tuple[tuple[str, str, str], dict[str, Any]]]:
    """Every TTFT and TPOT tax estimate of a taxes document with its key (config, phase/cell,
    metric); a cell that is both ref_safe and ref_load comes twice, once per entry."""
    out = []
    cells = [(f"{PHASE_A}/{e.get('cell')}", e) for e in (taxes.get("phase_a") or {}).values()]
    cells += [
        (f"{phase}/{label}", c)
        for phase in (PHASE_B, PHASE_B_PRIME)
        for label, c in ((taxes.get(phase) or {}).get("cells") or {}).items()
    ]
    for where, entry in cells:
        for name, t in (entry.get("variants") or {}).items():
            for m in ("ttft_p90", "tpot_p90"):
                out.append(((name, where, m), t[m]))
    return out


def tax_estimates(taxes: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(config, phase/cell, metric) -> the tax estimate ({"value", "ci", ...}) of a taxes document."""
    return dict(tax_entries(taxes))


def _tax_values(taxes: dict[str, Any]) -> dict[tuple[str, str, str], float | None]:
    return {k: v.get("value") for k, v in tax_estimates(taxes).items()}


def truth(
    study: StudyConfig,
    reference: dict[str, float],
    variants: list[str] | None = None,
    ts: TruthSettings = TruthSettings(),
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The oracle's document: per configuration and load the true p90s, the true taxes and
    the true H1–H6, each with its 95% interval and the margin to the study's threshold."""
    names = variants or study.names
    if K.PLAIN not in names:
        names = [K.PLAIN, *names]
    series = simulate(study, reference, names, ts, progress)
    reps = min(len(s.p90s["ttft_ms"]) for s in series.values())
    pooled_rows = [_row(s, {m: s.value(m) for m in METRICS}, reps * ts.requests) for s in series.values()]
    rep_rows = [
        [_row(s, {m: s.p90s[m][r] for m in METRICS}, ts.requests) for s in series.values()] for r in range(reps)
    ]
    rep_docs = [hypotheses_of(rows, names, reference) for rows in rep_rows]
    taxes, first = hypotheses_of(pooled_rows, names, reference)
    cis = {
        h: ci
        for h in first
        if first[h].get("value") is not None
        and (ci := _interval(first[h]["value"], [d[1][h].get("value") for d in rep_docs])) is not None
    }
    rep_taxes = [_tax_values(d[0]) for d in rep_docs]
    tax_rows: list[dict[str, Any]] = []
    for key, value in _tax_values(taxes).items():
        if value is not None:
            tax_rows.append(
                {
                    "variant": key[0],
                    "cell": key[1],
                    "metric": key[2],
                    "value": value,
                    "ci": _interval(value, [t.get(key) for t in rep_taxes]),
                }
            )
    # judged with the oracle's own intervals, of the taxes too: a ratio whose denominator tax
    # the oracle cannot tell from 0 has no true call either
    tax_cis: dict[tuple[str, str, str], list[float] | None] = {
        (t["variant"], t["cell"], t["metric"]): t["ci"] for t in tax_rows
    }
    _, hyps = hypotheses_of(pooled_rows, names, reference, cis, tax_cis=tax_cis)
    cells = [
        {
            "variant": s.variant,
            "cell": s.load.key,
            "rate": s.load.rate,
            "shape": s.load.shape,
            **{f"{m}_p90": s.value(m) for m in METRICS},
            **{f"{m}_p90_half_width": s.half_width(m) for m in METRICS},
        }
        for s in series.values()
    ]
    for h in hyps.values():
        h["margin"] = margin(h)
    worst = max((x.half_width(m) / x.value(m) for x in series.values() for m in METRICS if x.value(m)), default=None)
    return {
        "simulated": True,
        "study": study.study,
        "reference": reference,
        "variants": names,
        "method": __doc__.split("\n\n")[2].replace("\n", " "),
        "settings": dataclasses.asdict(ts),
        "replications": reps,
        "precision": {"target": ts.precision, "reached": worst, "met": worst is not None and worst <= ts.precision},
        "cells": cells,
        "taxes": tax_rows,
        "hypotheses": hyps,
    }


def margin(h: dict[str, Any]) -> dict[str, float] | None:
    """Distance of a hypothesis's value from its nearest threshold (in its own units), and in
    the oracle's half-widths."""
    if h.get("value") is None or h.get("verdict") not in ("supported", "refuted"):
        return None
    thresholds = next(iter(h["thresholds"].values()))
    distance = min(abs(h["value"] - t) for t in thresholds)
    ci = h.get("ci")
    half = (ci[1] - ci[0]) / 2 if ci else None
    return {"distance": distance, "oracle_half_width": half, "in_half_widths": distance / half if half else math.inf}
