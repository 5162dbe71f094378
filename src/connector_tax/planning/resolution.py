"""The smallest tax a planned study can resolve: each tax's 95 % interval half-width, before it runs.

`ctax plan --predict` computes every variant's Phase A and Phase B in virtual time
(predict.py). The analysis's own code then gives each predicted tax its interval, paired by request, as it will
for the real cells. A Phase B shape with no other variant's cell is judged by the tax of the
baseline's cell against itself (a zero tax, its two intervals taken as independent): only a
guide, as a run's paired taxes can be narrower (common requests) or wider (a slower variant's
cell is noisier; the default study's mooncake_both 64x8 TTFT tax: ±60 pp, docs/simulator.md,
against ±35). A
cell with fewer than MIN_P90_SAMPLES requests (64) will have no p90 interval at all: its taxes
cannot be called, whatever their size, and the plan says so before anything runs.

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
from dataclasses import dataclass
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


def unbounded_cells(results_dir: Path, entries: list[TaxResolution]) -> list[str]:
    """From a prediction (`ctax plan --predict`; `entries` its resolution()): the predicted Phase B
    cells with no interval, why, and the setting that would give each one NEED requests."""
    layout = StudyLayout(Path(results_dir))
    out = []
    for e in entries:
        if not e.at.startswith("phase_b") or all(m.half_width is not None for m in e.metrics()):
            continue
        phase, label = e.at.split()
        summary = read_summary(layout.phase(e.cell_of, phase).cell(label))
        rate, floor = (summary.rate, summary.duration_s) if summary else (None, None)
        requests = min(m.requests for m in e.metrics())
        why = (summary.stop_reason if summary else None) or "too few requests"
        if rate and floor and "floor" in why:
            # As many more seconds as requests are missing, at the rate this saturated cell
            # completed them (requests still queued at the floor are lost to the drain).
            need = floor * (NEED + 2 * math.sqrt(NEED)) / max(requests, 1)
            fix = f"workload.duration_s: {max(floor_for(rate), int(math.ceil(need / 10.0) * 10))} (it ends at its {floor:g} s floor)"
        else:
            fix = f"workload.min_completed: {NEED}"
        out.append(f"{e.at} {e.cell_of}: {requests} requests ({why}); to bound it: {fix}")
    return out


ZERO = "(any, at the baseline's cell length)"  # a Phase B shape with no other variant's cell
LAUNCHES = (2, 3, 4, 6, 8)


@dataclass
class Resolved:
    """One metric of a predicted tax: its value (None for a zero tax), its 95 % half-width (None:
    no interval), the requests of the shorter of its two cells, and with a measured launch spread
    its half-width at k launches per variant (with_launches)."""

    tax: float | None
    half_width: float | None
    requests: int
    launches: dict[str, float] | None = None


@dataclass
class TaxResolution:
    """What one predicted tax can resolve: where (`phase_a ref_safe (r8)`, `phase_b 512x8`), whose
    (a variant, or ZERO), and cell_of: the variant whose cell is the shorter of the tax's two."""

    at: str
    variant: str
    cell_of: str
    ttft_p90: Resolved
    tpot_p90: Resolved

    def metrics(self) -> tuple[Resolved, Resolved]:
        return self.ttft_p90, self.tpot_p90


def _half(estimate: dict[str, Any]) -> float | None:
    ci = estimate.get("ci")
    if not ci or None in ci:
        return None
    return float(ci[1] - ci[0]) / 2


def _tax_item(
    at: str, variant: str, tax: dict[str, Any], x: dict[str, Any], b: dict[str, Any], baseline: str
) -> TaxResolution:
    """One predicted tax of `variant` at `at` (x the variant's aggregate row, b the baseline's)."""
    got: dict[str, Resolved] = {}
    for name, metric in METRICS:
        n = min(x.get(f"{metric}_n") or 0, b.get(f"{metric}_n") or 0)
        got[name] = Resolved((tax.get(name) or {}).get("value"), _half(tax.get(name) or {}), n)
    fewer = min(x.get(f"{m}_n") or 0 for _, m in METRICS) <= min(b.get(f"{m}_n") or 0 for _, m in METRICS)
    return TaxResolution(at, variant, variant if fewer else baseline, got["ttft_p90"], got["tpot_p90"])


def _zero_item(phase: str, label: str, row: dict[str, Any], baseline: str) -> TaxResolution:
    got: dict[str, Resolved] = {}
    for name, metric in METRICS:
        k = f"{metric}_p90"
        lo, hi = row.get(f"{k}_ci_lo"), row.get(f"{k}_ci_hi")
        zero = ratio_minus_one(row.get(k), lo, hi, row.get(k), lo, hi)
        got[name] = Resolved(None, _half(zero), row.get(f"{metric}_n") or 0)
    return TaxResolution(f"{phase} {label}", ZERO, baseline, got["ttft_p90"], got["tpot_p90"])


def resolution(results_dir: Path) -> list[TaxResolution]:
    """One entry per (where, variant). Phase B: every variant's paired tax where the prediction
    computed its cells, else the baseline's zero tax."""
    aggregate = build(Path(results_dir))["aggregate"]
    rows = {(r["variant"], r["phase"], r["cell"]): r for r in aggregate["rows"]}
    baseline = aggregate.get("baseline")
    taxes = aggregate.get("taxes") or {}
    out: list[TaxResolution] = []
    seen: set[str] = set()
    for ref in ("ref_safe", "ref_load"):
        entry = (taxes.get("phase_a") or {}).get(ref) or {}
        if not entry.get("cell") or entry["cell"] in seen:
            continue
        seen.add(entry["cell"])
        for variant, tax in (entry.get("variants") or {}).items():
            x, b = (rows.get((v, "phase_a", entry["cell"])) or {} for v in (variant, baseline))
            out.append(_tax_item(f"phase_a {ref} ({entry['cell']})", variant, tax, x, b, baseline))

    def shape(item: tuple[tuple[str, str, str], dict[str, Any]]) -> tuple[str, int, int, str]:
        (_, phase, label), row = item
        return phase, int(row.get("input_len") or 0), int(row.get("output_len") or 0), label

    for (variant, phase, label), row in sorted(rows.items(), key=shape):  # by phase, then input and output
        if variant != baseline or phase == "phase_a":
            continue
        paired = (((taxes.get(phase) or {}).get("cells") or {}).get(label) or {}).get("variants") or {}
        if not paired:
            out.append(_zero_item(phase, label, row, baseline))
        for other, tax in paired.items():
            out.append(_tax_item(f"{phase} {label}", other, tax, rows.get((other, phase, label)) or {}, row, baseline))
    return out


def with_launches(entries: list[TaxResolution], launch_sd: dict[str, float], variants: int) -> None:
    """Add to every entry with an interval its half-width at k launches per variant (LAUNCHES),
    given the sd of one launch's log p90 per metric (`launch_sd`: {"ttft_p90": .., "tpot_p90": ..})
    and the number of variants the launch variance is pooled over (the A/A control included)."""
    for e in entries:
        for (name, _), v in zip(METRICS, e.metrics(), strict=True):
            sd = launch_sd.get(name)
            if v.half_width is None or sd is None:
                continue
            within = (math.log1p(v.half_width) / 1.96) ** 2  # one launch's within-launch variance (log)
            v.launches = {
                str(k): math.expm1(t975(max(1, (variants - 1) * (k - 1))) * math.sqrt((within + 2 * sd**2) / k))
                for k in LAUNCHES
            }


def _launches(v: Resolved, what: str = "with launches") -> str:
    if not v.launches:
        return ""
    return f" ({what}: " + ", ".join(f"k={k} ±{h * 100:.1f}" for k, h in v.launches.items()) + ")"


def _one(e: TaxResolution) -> str:
    """A line's metrics for one tax (or a zero tax)."""
    parts = []
    for (name, _), v in zip(METRICS, e.metrics(), strict=True):
        if v.half_width is None:
            parts.append(f"{name} no interval ({v.requests} requests in a cell; a p90 interval needs {NEED})")
            continue
        tax = f"{v.tax * 100:+.1f}% " if v.tax is not None else ""
        parts.append(f"{name} {tax}±{v.half_width * 100:.1f} pp" + _launches(v))
    return "; ".join(parts)


def _shape(group: list[TaxResolution]) -> str:
    """A line's metrics for one Phase B shape's paired taxes: the range of their half-widths, the
    widest one's variant (and its half-width at k launches), and how many have none."""
    parts = []
    for i, (name, _) in enumerate(METRICS):
        bounded = [(e.metrics()[i], e.variant) for e in group if e.metrics()[i].half_width is not None]
        short = [e.metrics()[i].requests for e in group if e.metrics()[i].half_width is None]
        text = name
        if bounded:
            widest, whose = max(bounded, key=lambda vw: vw[0].half_width or 0.0)
            lo = min(v.half_width or 0.0 for v, _ in bounded)
            text += f" ±{lo * 100:.1f} to ±{(widest.half_width or 0.0) * 100:.1f} pp ({whose})"
            text += _launches(widest, "the widest with launches")
        if short:
            fewest = f"{min(short)}-{max(short)}" if min(short) < max(short) else f"{min(short)}"
            text += f"{',' if bounded else ''} {len(short)} with no interval ({fewest} requests; needs {NEED})"
        parts.append(text)
    return "; ".join(parts)


def render(entries: list[TaxResolution], unbounded: list[str] | None = None) -> str:
    """Phase A: one line per tax. Phase B: one line per shape, the range over its variants' paired
    taxes (each is in --json's resolution), or the baseline's zero tax where only it was computed."""
    if not entries:
        return ""
    lines = [
        "",
        "smallest tax the plan can resolve: 95 % half-width of each tax (predicted cells; the host's own noise",
        "widens a real run's, so these are lower bounds)",
    ]
    shapes: set[str] = set()
    for e in entries:
        if e.at.startswith("phase_a") or e.variant == ZERO:
            lines.append(f"  {e.at:28} {e.variant:38} " + _one(e))
        elif e.at not in shapes:
            shapes.add(e.at)
            group = [x for x in entries if x.at == e.at]
            lines.append(f"  {e.at:28} {f'{len(group)} variants, paired with the baseline':38} " + _shape(group))
    if unbounded:
        lines += [
            "",
            "cells the plan predicts cannot be bounded (no interval on their taxes, known before any GPU time):",
        ]
        lines += [f"  {line}" for line in unbounded]
    return "\n".join(lines) + "\n"
