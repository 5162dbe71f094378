"""What changed between two studies, or two variants of one, cell by cell, with launch-aware intervals.

`compare(A, B)` takes two sides, each a study folder (`results/<study>`) or a variant of one
(`results/<study>:<variant>`), and returns, for every variant, phase, cell and metric both sides
share, B's value beside A's, the change B / A - 1 with its 95 % interval, and a call:

* **changed** — the interval excludes 0;
* **no change resolved** — the interval includes 0 and lies within ± the margin (default 10 %):
  whatever changed is smaller than the margin;
* **below resolution** — the interval includes 0 and reaches past the margin: these cells
  cannot tell a change of that size from none;
* **no interval** — a cell behind it is too small to bound its p90.

The intervals are the analysis's launch-aware ones (launch_intervals.py):

* a latency p90 (`ttft_p90`, `tpot_p90`) of one variant in two studies: replicate r of B
  against replicate r of A, paired by request when both cells drew the same traffic (the same
  study seed: common random numbers across studies), else as two independent cells; the mean
  over the replicates both ran, with 2 s_L^2 / k for the launches (each replicate compares two
  launches), s_L^2 pooled from both studies' variants x replicates tables. Two variants of one
  study are that study's own paired tax of one over the other;
* a tax (`tax_ttft_p90`, `tax_tpot_p90`, against each study's baseline): when both studies drew
  the same traffic for the variant and the baseline, per replicate both ran, the change of the log
  tax over the requests all four cells completed, paired by index, with 4 s_L^2 / k for the four
  launches; else each study's tax with its own launch-aware interval, the two as independent terms
  on the log scale (Satterthwaite's degrees of freedom);
* the same measurement on both sides (a study against a copy of itself, a variant against itself)
  is one launch: its bias cancels, so a study compared with itself is 0 [0, 0], replicates or not
  (launch_intervals.launch_weight).

A comparison without a row (no measured cell on a side, none measured on both, none the same
cell) says why in `nothing_compared`: `ctax compare` exits 2 on it, never a pass.

A cell is compared only where it is the same cell on both sides: the same backend and model
(study-wide), the same phase, label, rate, shape and arrival process; others are listed with the
reason, not compared. The settings and versions that differ come from the study configs, each
variant's first launch index (run.json: launch settings, server versions, code) and the
manifests. Reads files only; `tests/*/test_compare*.py` check it, and its coverage against the
simulator's truth is oracle/compare_coverage.py's.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from connector_tax.analysis.batchmeans import t975
from connector_tax.analysis.compare_sides import (
    Cells,
    CompareError,
    Side,
    cell_problem,
    describe,
    open_side,
    pair_name,
    settings_differences,
    study_problem,
)
from connector_tax.analysis.launch_intervals import (
    PairedRatio,
    aligned_log_ratio,
    paired_log_ratio,
    pooled,
    tax_interval,
)
from connector_tax.config import PHASE_A, PHASE_B, PHASE_B_PRIME

__all__ = ["DEFAULT_MARGIN", "CALLS", "Change", "CompareError", "compare"]

DEFAULT_MARGIN = 0.10
CALLS = ("changed", "no change resolved", "below resolution", "no interval")
LATENCIES = {"ttft_p90": "ttft_ms", "tpot_p90": "tpot_ms"}
TAXES = {"tax_ttft_p90": "ttft_ms", "tax_tpot_p90": "tpot_ms"}
PHASES = (PHASE_A, PHASE_B, PHASE_B_PRIME)
# MANIFEST.tsv columns that say which software measured (the rest are facts of one run).
METHOD = (
    "a p90 of one variant in two studies: per replicate both ran, the log ratio of B's and A's p90 "
    "(paired by request when both drew the same traffic), its within-launch variance from batch means "
    "and the jackknife, plus 2 s_L^2 / k for the launches (s_L^2 pooled from both studies' variants x "
    "replicates tables); two variants of one study: that study's paired tax of one over the other; a "
    "tax: on the same traffic, the change of the log tax over the requests all four cells completed, "
    "paired by index, plus 4 s_L^2 / k; else each study's launch-aware interval, the two independent on "
    "the log scale (Satterthwaite's df); the same measurement on both sides (a study against itself) adds "
    "no launch term. "
    "Student-t, exponentiated: never below -100 %"
)


# --------------------------------------------------------------------------- estimates


def estimate_terms(est: dict[str, Any] | None) -> dict[str, Any] | None:
    """The one place this module reads an analysis estimate (a tax's {"value", "ci", ...}): its
    log-scale mean, variance and degrees of freedom, or None without an interval."""
    if not est or est.get("value") is None or not est.get("ci") or None in est["ci"]:
        return None
    mean = math.log1p(float(est["value"]))
    half, df = est.get("log_half_width"), int(est.get("df") or 0)
    variance = (float(half) / t975(df)) ** 2 if half is not None and df > 0 else 0.0
    return {"mean": mean, "variance": variance, "df": max(df, 1), "launch_share": est.get("launch_share")}


def log_difference(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """B / A - 1 of two independent log-scale estimates, with its 95 % interval."""
    d, var = b["mean"] - a["mean"], a["variance"] + b["variance"]
    if var <= 0:
        return {"value": math.expm1(d), "ci": [math.expm1(d), math.expm1(d)], "df": None, "launch_share": None}
    den = sum(t["variance"] ** 2 / t["df"] for t in (a, b) if t["variance"] > 0)
    df = max(1, int(var**2 / den))
    half = t975(df) * math.sqrt(var)
    shares = [t["launch_share"] for t in (a, b)]
    share = None if None in shares else sum(t["launch_share"] * t["variance"] for t in (a, b)) / var
    return {"value": math.expm1(d), "ci": [math.expm1(d - half), math.expm1(d + half)], "df": df, "launch_share": share}


def call_of(ci: list[float] | None, margin: float) -> str:
    """The call on a change's interval (CALLS): a margin m is ±m on the ratio's log scale."""
    if not ci or None in ci:
        return "no interval"
    lo, hi = ci
    if lo > 0 or hi < 0:
        return "changed"
    if lo >= 1.0 / (1.0 + margin) - 1.0 and hi <= margin:
        return "no change resolved"
    return "below resolution"


# --------------------------------------------------------------------------- one row


@dataclass
class Change:
    """One row of compare.csv."""

    variant: str
    phase: str
    cell: str
    metric: str
    a_value: float | None
    b_value: float | None
    change: float | None
    ci_lo: float | None
    ci_hi: float | None
    call: str
    a_ci_lo: float | None = None
    a_ci_hi: float | None = None
    b_ci_lo: float | None = None
    b_ci_hi: float | None = None
    launch_share: float | None = None
    replicates: int | None = None
    paired: bool | None = None
    note: str | None = None


def _ci(est: dict[str, Any] | None) -> list[float | None]:
    ci = (est or {}).get("ci")
    return list(ci) if ci else [None, None]


def latency_change(
    a: Cells, b: Cells, va: str, vb: str, phase: str, label: str, metric: str, margin: float, one_study: bool = False
) -> Change:
    """One variant's p90 of `metric` ("ttft_p90", "tpot_p90") in B against A (see the docstring)."""
    m = LATENCIES[metric]
    if one_study:
        est = a.launch.tax(vb, va, phase, label, m)  # two variants of one study: its own paired tax
        a_value, b_value, note = est.get("base_p90"), est.get("x_p90"), est.get("note")
    else:
        reps = sorted(set(a.replicates(va, phase, label)) & set(b.replicates(vb, phase, label)))
        pairs: list[PairedRatio] = []
        for r in reps:
            xa, xb = a.series[(va, phase, label, r)].get(m), b.series[(vb, phase, label, r)].get(m)
            same = a.seeds.get((va, phase, label, r)) is not None and (
                a.seeds.get((va, phase, label, r)) == b.seeds.get((vb, phase, label, r))
            )
            if xa is not None and xb is not None and (p := paired_log_ratio(xb, xa, common_traffic=same)) is not None:
                pairs.append(p)
        launch = pooled(a.launch.launch(phase, label, m, a.baseline), b.launch.launch(phase, label, m, b.baseline))
        est = tax_interval(pairs, launch)
        xa_rows = [a.launch.rows.get((va, phase, label, r)) or {} for r in reps]
        xb_rows = [b.launch.rows.get((vb, phase, label, r)) or {} for r in reps]
        a_value, b_value = _geomean(xa_rows, f"{m}_p90"), _geomean(xb_rows, f"{m}_p90")
        dropped = len(set(a.replicates(va, phase, label)) ^ set(b.replicates(vb, phase, label)))
        note = est.get("note")
        if dropped:
            note = "; ".join(filter(None, [note, f"{dropped} launch(es) ran on one side only, not compared"]))
    lo, hi = _ci(est)
    return Change(
        variant=pair_name(va, vb),
        phase=phase,
        cell=label,
        metric=metric,
        a_value=a_value,
        b_value=b_value,
        change=est.get("value"),
        ci_lo=lo,
        ci_hi=hi,
        call=call_of(est.get("ci"), margin),
        launch_share=est.get("launch_share"),
        replicates=est.get("replicates"),
        paired=est.get("paired"),
        note=note,
    )


def tax_change(a: Cells, b: Cells, va: str, vb: str, phase: str, label: str, metric: str, margin: float) -> Change:
    """One variant's tax against its study's baseline, in B against A."""
    m = TAXES[metric]
    assert a.baseline is not None and b.baseline is not None  # only asked where both measured their baseline
    ta = a.launch.tax(va, a.baseline, phase, label, m)
    tb = b.launch.tax(vb, b.baseline, phase, label, m)
    terms_a, terms_b = estimate_terms(ta), estimate_terms(tb)
    row = Change(
        variant=pair_name(va, vb),
        phase=phase,
        cell=label,
        metric=metric,
        a_value=ta.get("value"),
        b_value=tb.get("value"),
        change=None,
        ci_lo=None,
        ci_hi=None,
        call="no interval",
    )
    row.a_ci_lo, row.a_ci_hi = _ci(ta)
    row.b_ci_lo, row.b_ci_hi = _ci(tb)
    row.note = "; ".join(sorted({n for n in (ta.get("note"), tb.get("note")) if n})) or None
    if ta.get("value") is not None and tb.get("value") is not None:
        row.change = (1 + tb["value"]) / (1 + ta["value"]) - 1
    paired = _paired_tax_change(a, b, va, vb, phase, label, m)
    if paired is not None:  # the same traffic on all four sides: request by request
        row.change, (row.ci_lo, row.ci_hi) = paired.get("value"), _ci(paired)
        row.call, row.launch_share = call_of(paired.get("ci"), margin), paired.get("launch_share")
        row.replicates, row.paired = paired.get("replicates"), True
        row.note = "; ".join(filter(None, [row.note, paired.get("note")])) or None
        return row
    if terms_a is None or terms_b is None:
        return row
    diff = log_difference(terms_a, terms_b)
    row.change, (row.ci_lo, row.ci_hi) = diff["value"], diff["ci"]
    row.call, row.launch_share = call_of(diff["ci"], margin), diff["launch_share"]
    row.replicates = min(int(ta.get("replicates") or 0), int(tb.get("replicates") or 0)) or None
    return row


def _paired_tax_change(a: Cells, b: Cells, va: str, vb: str, phase: str, label: str, m: str) -> dict[str, Any] | None:
    """A tax's change when both studies drew the same traffic for the variant and the baseline
    (the same seed): per replicate both ran, log(p90 xB / p90 baseB) - log(p90 xA / p90 baseA) over
    the requests all four cells completed, paired by index, plus 4 s_L^2 / k for the four launches
    (fewer where a side's cells are the other's: launch_weight). None where any side's traffic differs: then the two
    taxes are independent terms (log_difference), which common traffic would make err wide."""
    assert a.baseline is not None and b.baseline is not None
    pairs: list[PairedRatio] = []
    for r in sorted(set(a.replicates(va, phase, label)) & set(b.replicates(vb, phase, label))):
        keys = ((a, va), (a, a.baseline), (b, vb), (b, b.baseline))
        seeds = [side.seeds.get((name, phase, label, r)) for side, name in keys]
        if None in seeds or seeds[0] != seeds[2] or seeds[1] != seeds[3]:
            return None
        found = [side.series.get((name, phase, label, r), {}).get(m) for side, name in keys]
        series = [x for x in found if x is not None]
        if len(series) < len(keys):
            return None
        xa, ba, xb, bb = series
        pair = aligned_log_ratio([(1, xb), (-1, bb), (-1, xa), (1, ba)])
        if pair is None:
            return None
        pairs.append(pair)
    if not pairs:
        return None
    launch = pooled(a.launch.launch(phase, label, m, a.baseline), b.launch.launch(phase, label, m, b.baseline))
    return tax_interval(pairs, launch)  # each pair carries its four launches' weight (launch_weight)


def _natural(label: str) -> tuple[tuple[int, int | str], ...]:
    """A cell label's sort key with its numbers as numbers: r8 before r16, 64x8 before 512x8."""
    return tuple((0, int(t)) if t.isdigit() else (1, t) for t in re.findall(r"\d+|\D+", label))


def _geomean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and r[key] > 0]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


# --------------------------------------------------------------------------- the comparison


def _pairs(a: Side, b: Side) -> list[tuple[str, str]]:
    if a.variant or b.variant:
        if not (a.variant and b.variant):
            raise CompareError("name a variant on both sides (DIR:VARIANT) or on neither")
        return [(a.variant, b.variant)]
    if a.root.resolve() == b.root.resolve():
        raise CompareError(f"{a.spec} and {b.spec} are one study: name two variants (DIR:VARIANT DIR:VARIANT)")
    shared = [v for v in a.study.variants if v in b.study.variants]
    if not shared:
        raise CompareError(f"{a.spec} and {b.spec} share no variant: name one on each side (DIR:VARIANT)")
    return [(v, v) for v in shared]


def _nothing_compared(a: Side, b: Side, pairs: list[tuple[str, str]], not_comparable: list[dict[str, str]]) -> str:
    """Why a comparison has no row, in one line: a side without measured cells, no cell measured
    on both, or none of those the same cell (the first reason, and how many more)."""
    empty = [
        f"{name} ({side.spec})"
        for name, side, variants in (("A", a, [va for va, _ in pairs]), ("B", b, [vb for _, vb in pairs]))
        if not any(side.cells.measured(v) for v in variants)
    ]
    if empty:
        return f"no measured cells in {' or '.join(empty)}"
    if all(n["why"].startswith("measured in ") for n in not_comparable):
        return "no cell was measured on both sides"
    reasons = [n for n in not_comparable if not n["why"].startswith("measured in ")]
    first = reasons[0]
    more = f", and {len(reasons) - 1} more" if len(reasons) > 1 else ""
    return (
        f"none of the cells measured on both sides is the same cell "
        f"(`{first['variant']}` {first['phase']} {first['cell']}: {first['why']}{more})"
    )


def compare(a_spec: str, b_spec: str, margin: float = DEFAULT_MARGIN) -> dict[str, Any]:
    """The comparison of side B against side A (raises CompareError, one line, on bad input)."""
    if not margin > 0:
        raise CompareError(f"--margin: {margin!r} is not a positive fraction (0.1 = ±10 %)")
    a, b = open_side(a_spec), open_side(b_spec)
    pairs = _pairs(a, b)
    one_study = a.root.resolve() == b.root.resolve()
    rows: list[Change] = []
    not_comparable: list[dict[str, str]] = []
    problem = study_problem(a, b)
    ca, cb = a.cells, b.cells
    base_a, base_b = ca.measured(ca.baseline), cb.measured(cb.baseline)
    for va, vb in pairs:
        cells_a, cells_b = ca.measured(va), cb.measured(vb)
        for phase, label in sorted(cells_a | cells_b, key=lambda k: (PHASES.index(k[0]), _natural(k[1]))):
            where = {"variant": pair_name(va, vb), "phase": phase, "cell": label}
            if (phase, label) not in cells_b or (phase, label) not in cells_a:
                side = "A" if (phase, label) in cells_a else "B"
                not_comparable.append({**where, "why": f"measured in {side} only"})
                continue
            why = problem or cell_problem(a.planned[(phase, label)], b.planned[(phase, label)])
            if why:
                not_comparable.append({**where, "why": why})
                continue
            rows += [latency_change(ca, cb, va, vb, phase, label, m, margin, one_study) for m in LATENCIES]
            # Taxes: across studies only (two variants of one study share the baseline, so the
            # change of their taxes is the latency change above), each against its own baseline.
            if (
                not one_study
                and (phase, label) in base_a
                and (phase, label) in base_b
                and va != ca.baseline
                and vb != cb.baseline
            ):
                rows += [tax_change(ca, cb, va, vb, phase, label, m, margin) for m in TAXES]
    return {
        "a": describe(a),
        "b": describe(b),
        "nothing_compared": None if rows else _nothing_compared(a, b, pairs, not_comparable),
        "one_study": one_study,
        "simulated": a.study.simulated or b.study.simulated,
        "margin": margin,
        "method": METHOD,
        "rows": [asdict(r) for r in rows],
        "not_comparable": not_comparable,
        "differences": settings_differences(a, b, pairs),
    }
