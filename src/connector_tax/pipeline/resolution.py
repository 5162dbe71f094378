"""The smallest tax a planned study can resolve: each tax's 95 % interval half-width, before it runs.

`ctax plan --predict` computes Phase A of every variant and the baseline's Phase B in virtual
time (predict.py). The analysis's own code then gives each predicted cell its batch-means
interval and each Phase A tax its delta-method interval, as it will for the real cells; a Phase
B shape, computed for the baseline only, is judged by the tax of the baseline's cell against
itself (a zero tax), whose interval is the smallest tax that shape can tell from none. A cell
with fewer than MIN_P90_SAMPLES requests (64) will have no p90 interval at all:
its taxes cannot be called, whatever their size, and the plan says so before anything runs.

The predicted cells carry what the profile models (the engine, the API server's delays), not the
host's own noise, so a real run's intervals are wider: these half-widths are a lower bound. With
a measured launch-to-launch spread (`ctax plan --predict --launch-sd TTFT,TPOT`: the sd of one
launch's log p90, e.g. from `ctax benchmark launch_variance` or a replicated study's taxes'
`launch_sd`) each tax's half-width is also given at k launches per variant as the analysis will
compute it (analysis/launch_intervals.py: variance within/k + 2 sd²/k, Student-t at
(variants − 1)(k − 1) degrees of freedom), and the fewest launches that reach a target.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from connector_tax.analysis import build
from connector_tax.analysis.batchmeans import t975
from connector_tax.analysis.launch_intervals import MIN_P90_SAMPLES
from connector_tax.analysis.quantiles import ratio_minus_one
from connector_tax.config import StudyConfig
from connector_tax.contract import StudyLayout
from connector_tax.contract.index import read_summary

METRICS = (("ttft_p90", "ttft_ms"), ("tpot_p90", "tpot_ms"))
NEED = MIN_P90_SAMPLES  # requests a cell's latency p90 needs for any interval (analysis/launch_intervals.py)


def floor_for(rate: float) -> int:
    """The duration floor (s, a multiple of 10) at which a cell ended at its floor has NEED
    requests at `rate` but for a two-sigma Poisson shortfall."""
    return int(math.ceil((NEED + 2 * math.sqrt(NEED)) / rate / 10.0) * 10)


def unbounded_warnings(study: StudyConfig) -> list[str]:
    """Before any run (`ctax config check`): Phase B cells that will have no interval if their
    shape saturates at the reference rate, with the setting that would bound them. The overload
    guard ends such a cell at its duration floor, with about duration_s x rate requests; the
    reference rate is one of Phase A's, so the lowest of them is the case to check."""
    workload = study.workload
    if not workload.phase_b.get("overload_guard", True):
        return []
    rate = min(workload.phase_a.rates)
    floor = workload.duration_s
    if floor * rate >= NEED + 2 * math.sqrt(NEED):
        return []
    return [
        f"workload.duration_s {floor:g}: a Phase B cell whose shape saturates at its reference rate ends at this "
        f"floor (workload.phase_b.overload_guard) with about {floor * rate:.0f} requests at {rate:g} req/s (the "
        f"lowest Phase A rate, a possible ref_safe), fewer than the {NEED} its p90s need for an interval: it cannot "
        f"be bounded; set workload.duration_s: {floor_for(rate)} (or workload.phase_b.overload_guard: false, "
        "which runs it saturated to min_completed); `ctax plan --predict` names the cells"
    ]


def unbounded_cells(results_dir: Path, entries: list[dict[str, Any]], baseline: str) -> list[str]:
    """From a prediction (`ctax plan --predict`; `entries` its resolution()): the predicted Phase B
    cells with no interval, why, and the setting that would give each one NEED requests."""
    layout = StudyLayout(Path(results_dir))
    out = []
    for e in entries:
        if not e["at"].startswith("phase_b") or all(e[name]["half_width"] is not None for name, _ in METRICS):
            continue
        phase, label = e["at"].split()
        summary = read_summary(layout.phase(baseline, phase).cell(label))
        rate, floor = (summary.rate, summary.duration_s) if summary else (None, None)
        requests = min(e[name]["requests"] or 0 for name, _ in METRICS)
        why = (summary.stop_reason if summary else None) or "too few requests"
        if rate and floor and "floor" in why:
            # As many more seconds as requests are missing, at the rate this saturated cell
            # completed them (requests still queued at the floor are lost to the drain).
            need = floor * (NEED + 2 * math.sqrt(NEED)) / max(requests, 1)
            fix = f"workload.duration_s: {max(floor_for(rate), int(math.ceil(need / 10.0) * 10))} (it ends at its {floor:g} s floor)"
        else:
            fix = f"workload.min_completed: {NEED}"
        out.append(f"{e['at']}: {requests} requests ({why}); to bound it: {fix}")
    return out


def _half(estimate: dict[str, Any]) -> float | None:
    ci = estimate.get("ci")
    if not ci or None in ci:
        return None
    return float(ci[1] - ci[0]) / 2


def resolution(results_dir: Path) -> list[dict[str, Any]]:
    """One entry per (where, variant): the predicted tax and its half-width per metric, and the
    requests of the shorter of the two cells (an interval needs both)."""
    aggregate = build(Path(results_dir))["aggregate"]
    rows = {(r["variant"], r["phase"], r["cell"]): r for r in aggregate["rows"]}
    baseline = aggregate.get("baseline")
    taxes = aggregate.get("taxes") or {}
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for ref in ("ref_safe", "ref_load"):
        entry = (taxes.get("phase_a") or {}).get(ref) or {}
        if not entry.get("cell") or entry["cell"] in seen:
            continue
        seen.add(entry["cell"])
        for variant, tax in (entry.get("variants") or {}).items():
            item = {"at": f"phase_a {ref} ({entry['cell']})", "variant": variant}
            for name, metric in METRICS:
                x = rows.get((variant, "phase_a", entry["cell"])) or {}
                b = rows.get((baseline, "phase_a", entry["cell"])) or {}
                item[name] = {"tax": (tax.get(name) or {}).get("value"), "half_width": _half(tax.get(name) or {})}
                item[name]["requests"] = min(x.get(f"{metric}_n") or 0, b.get(f"{metric}_n") or 0)
            out.append(item)
    for (variant, phase, label), row in sorted(rows.items()):
        if variant != baseline or phase == "phase_a":
            continue
        item = {"at": f"{phase} {label}", "variant": "(any, at the baseline's cell length)"}
        for name, metric in METRICS:
            k = f"{metric}_p90"
            zero = ratio_minus_one(
                row.get(k),
                row.get(f"{k}_ci_lo"),
                row.get(f"{k}_ci_hi"),
                row.get(k),
                row.get(f"{k}_ci_lo"),
                row.get(f"{k}_ci_hi"),
            )
            item[name] = {"tax": None, "half_width": _half(zero), "requests": row.get(f"{metric}_n")}
        out.append(item)
    return out


LAUNCHES = (2, 3, 4, 6, 8)


def with_launches(entries: list[dict[str, Any]], launch_sd: dict[str, float], variants: int) -> None:
    """Add to every entry with an interval its half-width at k launches per variant (LAUNCHES),
    given the sd of one launch's log p90 per metric (`launch_sd`: {"ttft_p90": .., "tpot_p90": ..})
    and the number of variants the launch variance is pooled over (the A/A control included)."""
    for e in entries:
        for name, _ in METRICS:
            v, sd = e[name], launch_sd.get(name)
            if v["half_width"] is None or sd is None:
                continue
            within = (math.log1p(v["half_width"]) / 1.96) ** 2  # one launch's within-launch variance (log)
            v["launches"] = {
                str(k): math.expm1(t975(max(1, (variants - 1) * (k - 1))) * math.sqrt((within + 2 * sd**2) / k))
                for k in LAUNCHES
            }


def render(entries: list[dict[str, Any]], unbounded: list[str] | None = None) -> str:
    if not entries:
        return ""
    need = NEED
    lines = [
        "",
        "smallest tax the plan can resolve: 95 % half-width of each tax (predicted cells; the host's own noise",
        "widens a real run's, so these are lower bounds)",
    ]
    for e in entries:
        parts = []
        for name, _ in METRICS:
            v = e[name]
            if v["half_width"] is None:
                parts.append(
                    f"{name} no interval ({v['requests'] or 0} requests in a cell; a p90 interval needs {need})"
                )
            else:
                tax = f"{v['tax'] * 100:+.1f}% " if v["tax"] is not None else ""
                parts.append(f"{name} {tax}±{v['half_width'] * 100:.1f} pp")
                if v.get("launches"):
                    parts[-1] += (
                        " (with launches: " + ", ".join(f"k={k} ±{h * 100:.1f}" for k, h in v["launches"].items()) + ")"
                    )
        lines.append(f"  {e['at']:28} {e['variant']:38} " + "; ".join(parts))
    if unbounded:
        lines += [
            "",
            "cells the plan predicts cannot be bounded (no interval on their taxes, known before any GPU time):",
        ]
        lines += [f"  {line}" for line in unbounded]
    return "\n".join(lines) + "\n"
