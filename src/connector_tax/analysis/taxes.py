"""The substrate tax, exactly as the study defines it (docs/study-design.md, Taxes), with
confidence intervals.

  tax_TTFT_p90(X, ref) = TTFT_p90(X, ref) / TTFT_p90(baseline, ref) - 1
  tax_TPOT_p90(X, ref) = TPOT_p90(X, ref) / TPOT_p90(baseline, ref) - 1
  tax_step_p50(X)      = step_duration_us p50 (X) - step_duration_us p50 (baseline)
  tax_callback_p50(X)  = connector_total_us p50 (X)        (the baseline has no callbacks)
  build_meta_p50(X)    = build_meta_us p50 (X)              (the one hook inside the step)
  unattributed_p50(X)  = p50 of X's (step - build_meta), step by step, - step p50 (baseline)
  amplification(X)     = tax(X, ref_load) / tax(X, ref_safe)   (queueing amplification)

"At ref" is the cell where both configs ran at the same load: Phase A's cell at the reference
rate (ref_safe and ref_load), every Phase B shape (at Phase B's rate, ref_safe by default) and
every Phase B' shape (at ref_load). The baseline is "plain" unless the caller names another.

Given the cells' requests (`series`), the TTFT and TPOT taxes are launch_intervals.py's: paired
by request within each replicate, over every replicate, with the launch-to-launch variance in
the interval. Without them (the truth oracle's pooled p90s, the coverage check's reference
method) they are the delta method on two cells' intervals (quantiles.ratio_minus_one). The step
taxes compare each variant's first launch.

Unattributed is the step's growth that no hook timed *inside the step* explains. The study's
step is Scheduler.schedule(), and of the three hooks only build_connector_meta runs in it;
get_finished and start_load_kv run after it, in the model's execution (the worker), so their time
lengthens the engine step, not this one. The seed's `tax_step - tax_callback` subtracts them too
and is negative by construction, about minus the two hooks outside (docs/study-design.md, Taxes).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from connector_tax.analysis.estimates import ci_of, div_interval, unresolved
from connector_tax.analysis.launch_intervals import METHOD as LAUNCH_METHOD
from connector_tax.analysis.launch_intervals import (
    LaunchVariance,
    PairedRatio,
    Series,
    launch_variance,
    log_p90,
    paired_log_ratio,
    tax_interval,
)
from connector_tax.analysis.quantiles import TAX_CI_METHOD, difference, ratio_minus_one
from connector_tax.config import PHASE_A, PHASE_B, PHASE_B_PRIME

# {(variant, phase, cell label, replicate): {"ttft_ms": Series, "tpot_ms": Series}}
SeriesMap = dict[tuple[str, str, str, int], dict[str, Series]]


def _get(row: dict[str, Any], key: str) -> float | None:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def latency_tax(x: dict[str, Any], b: dict[str, Any], metric: str) -> dict[str, Any]:
    """tax of `metric` p90 ("ttft_ms", "tpot_ms") of row x over baseline row b."""
    k = f"{metric}_p90"
    est = ratio_minus_one(
        _get(x, k),
        _get(x, f"{k}_ci_lo"),
        _get(x, f"{k}_ci_hi"),
        _get(b, k),
        _get(b, f"{k}_ci_lo"),
        _get(b, f"{k}_ci_hi"),
    )
    return {
        **est,
        "x_p90": _get(x, k),
        "x_ci": [_get(x, f"{k}_ci_lo"), _get(x, f"{k}_ci_hi")],
        "x_n": x.get(f"{metric}_n"),
        "base_p90": _get(b, k),
        "base_ci": [_get(b, f"{k}_ci_lo"), _get(b, f"{k}_ci_hi")],
        "base_n": b.get(f"{metric}_n"),
        "x_valid": x.get("valid"),
        "base_valid": b.get("valid"),
    }


def _hook_p50(x: dict[str, Any], field: str, step: dict[str, Any]) -> dict[str, Any]:
    """X's p50 of a connector hook's time (`field`: build_meta_us, connector_total_us) with its
    interval; 0 where X recorded steps but no hook (a variant without a connector)."""
    k = f"{field}_p50"
    est: dict[str, Any] = {"value": _get(x, k), "ci": None}
    if est["value"] is not None and _get(x, f"{k}_ci_lo") is not None and _get(x, f"{k}_ci_hi") is not None:
        est["ci"] = [_get(x, f"{k}_ci_lo"), _get(x, f"{k}_ci_hi")]
    if est["value"] is None and step["value"] is not None:
        est = {"value": 0.0, "ci": [0.0, 0.0], "note": "no connector callbacks recorded"}
    return est


def _p50_difference(x: dict[str, Any], b: dict[str, Any], k: str) -> dict[str, Any]:
    """x's p50 of a step field (`k`: "..._p50") less b's, with the interval of the two."""
    ends = (k, f"{k}_ci_lo", f"{k}_ci_hi")
    return difference(*(_get(x, e) for e in ends), *(_get(b, e) for e in ends))


def step_taxes(x: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    k = "step_duration_us_p50"
    step = _p50_difference(x, b, k)
    step.update(x_p50=_get(x, k), base_p50=_get(b, k), x_steps=x.get("steps_n"), base_steps=b.get("steps_n"))
    callback = _hook_p50(x, "connector_total_us", step)
    build_meta = _hook_p50(x, "build_meta_us", step)
    # Per step, schedule() less build_meta (cellstats: step_other_us), against the baseline's step:
    # the hook and its step come from one record, so they are not two independent p50s.
    unattributed = _p50_difference(x, b, "step_other_us_p50")
    # The whole engine step (schedule, model, update), relative: on a CPU host the connector's
    # cost can land in the model's compute rather than in schedule() (a connector's thread on the
    # compute core: NIXL's progress thread), and the step records carry an interval where a short
    # cell's few requests give TTFT/TPOT none.
    e = "engine_step_us_p50"
    engine = ratio_minus_one(
        _get(x, e),
        _get(x, f"{e}_ci_lo"),
        _get(x, f"{e}_ci_hi"),
        _get(b, e),
        _get(b, f"{e}_ci_lo"),
        _get(b, f"{e}_ci_hi"),
    )
    engine.update(x_p50=_get(x, e), base_p50=_get(b, e))
    return {
        "step_p50_us": step,
        "callback_p50_us": callback,
        "build_meta_p50_us": build_meta,
        "unattributed_p50_us": unattributed,
        "engine_step_p50": engine,
    }


class LaunchTaxes:
    """The TTFT and TPOT taxes of launch_intervals.py from the cells' requests, replicate by
    replicate; the launch variance of each (cell, metric) computed once for every variant."""

    def __init__(self, series: SeriesMap, rows: list[dict[str, Any]]) -> None:
        self.series = series
        self.rows: dict[tuple[str, str, str, int], dict[str, Any]] = {
            (r["variant"], r["phase"], r["cell"], int(r.get("replicate") or 1)): r for r in rows
        }
        self._launch: dict[tuple[str, str, str], LaunchVariance] = {}
        self._pairs: dict[tuple[str, str, str, str, int, str], PairedRatio | None] = {}

    def replicates(self, name: str, phase: str, label: str) -> list[int]:
        return sorted(r for (n, ph, c, r) in self.series if (n, ph, c) == (name, phase, label))

    def launch(self, phase: str, label: str, metric: str, baseline: str | None) -> LaunchVariance:
        """The launch variance of a cell's metric; `baseline` None (a study without one): from
        the launches alone, with no paired within-launch noise."""
        key = (phase, label, metric)
        if key not in self._launch:
            logs: dict[str, dict[int, float]] = {}
            for (n, ph, c, r), m in self.series.items():
                if (ph, c) == (phase, label) and metric in m and (value := log_p90(m[metric])) is not None:
                    logs.setdefault(n, {})[r] = value
            pairs = (
                [self.pair(n, baseline, phase, label, r, metric) for n in logs if n != baseline for r in logs[n]]
                if baseline is not None
                else []
            )
            noise = [p.variance for p in pairs if p is not None and p.variance is not None]
            self._launch[key] = launch_variance(logs, float(np.mean(noise)) / 2 if noise else 0.0)
        return self._launch[key]

    def pair(self, name: str, baseline: str, phase: str, label: str, r: int, metric: str) -> PairedRatio | None:
        key = (name, baseline, phase, label, r, metric)
        if key not in self._pairs:
            x, b = self.series.get((name, phase, label, r)), self.series.get((baseline, phase, label, r))
            ok = x is not None and b is not None and metric in x and metric in b
            self._pairs[key] = paired_log_ratio(x[metric], b[metric]) if x and b and ok else None
        return self._pairs[key]

    def tax(self, name: str, baseline: str, phase: str, label: str, metric: str) -> dict[str, Any]:
        shared = [r for r in self.replicates(name, phase, label) if (baseline, phase, label, r) in self.series]
        pairs = [p for r in shared if (p := self.pair(name, baseline, phase, label, r, metric)) is not None]
        est = tax_interval(pairs, self.launch(phase, label, metric, baseline))
        xs = [self.rows.get((name, phase, label, r)) or {} for r in shared]
        bs = [self.rows.get((baseline, phase, label, r)) or {} for r in shared]
        k = f"{metric}_p90"
        return {
            **est,
            "method": "launch",
            "x_p90": _geomean([_get(x, k) for x in xs]),
            "x_ci": [_get(xs[0], f"{k}_ci_lo"), _get(xs[0], f"{k}_ci_hi")] if xs else [None, None],
            "x_n": sum(int(x.get(f"{metric}_n") or 0) for x in xs),
            "base_p90": _geomean([_get(b, k) for b in bs]),
            "base_ci": [_get(bs[0], f"{k}_ci_lo"), _get(bs[0], f"{k}_ci_hi")] if bs else [None, None],
            "base_n": sum(int(b.get(f"{metric}_n") or 0) for b in bs),
            "x_valid": all(x.get("valid") is not False for x in xs) if xs else None,
            "base_valid": all(b.get("valid") is not False for b in bs) if bs else None,
        }


def _geomean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def pair_taxes(
    x: dict[str, Any],
    b: dict[str, Any],
    launch: LaunchTaxes | None = None,
    where: tuple[str, str, str, str] | None = None,
) -> dict[str, Any]:
    """The taxes of variant row x over baseline row b; `launch` (with `where` = (variant,
    baseline, phase, label)) gives the TTFT and TPOT taxes from the requests of every launch."""
    if launch is not None and where is not None:
        out = {m: launch.tax(*where, metric) for m, metric in (("ttft_p90", "ttft_ms"), ("tpot_p90", "tpot_ms"))}
    else:
        out = {"ttft_p90": latency_tax(x, b, "ttft_ms"), "tpot_p90": latency_tax(x, b, "tpot_ms")}
    if x.get("steps_n") and b.get("steps_n"):
        out.update(step_taxes(x, b))
    return out


def amplification(safe: dict[str, Any] | None, load: dict[str, Any] | None) -> dict[str, Any]:
    """The queueing amplification of a tax: tax at ref_load / tax at ref_safe (how much more the
    same connector costs once the server queues), with the box of the two intervals. None, with
    `unresolved` saying why, where the ref_safe tax's interval covers 0: these cells cannot tell
    it from 0, and a ratio over it is noise of any size and sign (the hypotheses' rule:
    estimates.unresolved)."""
    if not safe or not load or safe.get("value") in (None, 0) or load.get("value") is None:
        return {"value": None, "ci": None}
    below = unresolved(safe, "ref_safe")
    if below is not None:
        return {"value": None, "ci": None, "unresolved": below}
    s_ci, l_ci = ci_of(safe), ci_of(load)
    return {"value": load["value"] / safe["value"], "ci": div_interval(l_ci, s_ci) if s_ci and l_ci else None}


def compute_taxes(
    rows: list[dict[str, Any]],
    configs: list[str],
    baseline: str,
    reference: dict[str, Any],
    series: SeriesMap | None = None,
) -> dict[str, Any]:
    """`series`: every cell's requests (launch_intervals.Series per metric), for the taxes paired by
    request over every replicate; without it, the delta method on each cell's p90 interval."""
    # One row per (variant, phase, cell): the first launch's (the step taxes and per-cell columns).
    index: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: -int(r.get("replicate") or 1)):
        index[(r["variant"], r["phase"], r["cell"])] = r
    launch = LaunchTaxes(series, rows) if series is not None else None
    others = [c for c in configs if c != baseline]
    out: dict[str, Any] = {
        "baseline": baseline,
        "ci_method": LAUNCH_METHOD if launch is not None else TAX_CI_METHOD,
        "replicates": max((int(r.get("replicate") or 1) for r in rows), default=1),
        "phase_a": {},
        PHASE_B: {},
        PHASE_B_PRIME: {},
    }
    for ref in ("ref_safe", "ref_load"):
        rate = reference.get(ref)
        entry: dict[str, Any] = {"rate": rate, "cell": None, "variants": {}, "missing": {}}
        if rate is not None:
            label = next(
                (
                    r["cell"]
                    for r in rows
                    if r["phase"] == PHASE_A
                    and r.get("rate") is not None
                    and abs(float(r["rate"]) - float(rate)) < 1e-9
                ),
                None,
            )
            entry["cell"] = label
            b = index.get((baseline, PHASE_A, label)) if label else None
            for name in others:
                x = index.get((name, PHASE_A, label)) if label else None
                if b is None or x is None:
                    entry["missing"][name] = f"no Phase A cell at r{float(rate):g} for " + (
                        baseline if b is None else name
                    )
                    continue
                entry["variants"][name] = pair_taxes(x, b, launch, (name, baseline, PHASE_A, str(label)))
        out["phase_a"][ref] = entry
    safe, load = out["phase_a"]["ref_safe"]["variants"], out["phase_a"]["ref_load"]["variants"]
    out["amplification"] = {
        name: {
            m: amplification((safe.get(name) or {}).get(m), (load.get(name) or {}).get(m))
            for m in ("ttft_p90", "tpot_p90")
        }
        for name in others
        if name in safe and name in load
    }
    for phase in (PHASE_B, PHASE_B_PRIME):
        cells: dict[str, Any] = {}
        labels = sorted(
            {r["cell"] for r in rows if r["phase"] == phase},
            key=lambda s: (index.get((baseline, phase, s)) or {}).get("input_len") or 0,
        )
        rates = {float(r["rate"]) for r in rows if r["phase"] == phase and r.get("rate") is not None}
        for label in labels:
            b = index.get((baseline, phase, label))
            any_row = next(r for r in rows if r["phase"] == phase and r["cell"] == label)
            # Which configurations the server could not take at this shape (the study's criteria):
            # their taxes stand, but a trend across shapes (H5, H6) must not rest on them.
            saturated = {
                r["variant"]: r.get("saturation_criteria") or "saturated"
                for r in rows
                if r["phase"] == phase and r["cell"] == label and r.get("saturated")
            }
            cell: dict[str, Any] = {
                "input": any_row.get("input_len"),
                "output": any_row.get("output_len"),
                "variants": {},
                "missing": {},
                "saturated": saturated,
            }
            for name in others:
                x = index.get((name, phase, label))
                if x is None:
                    continue
                if b is None:
                    cell["missing"][name] = f"no {phase} cell {label} for {baseline}"
                    continue
                cell["variants"][name] = pair_taxes(x, b, launch, (name, baseline, phase, label))
            cells[label] = cell
        out[phase] = {"rates": sorted(rates), "cells": cells}
    return out
