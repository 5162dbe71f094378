"""Saturation of each cell (the study's three criteria, which fired;
docs/study-design.md, Phase A) and the reference rates.

A cell at rate r is saturated if ANY of:
  1. throughput: effective throughput / offered rate < throughput_ratio_min (0.95)
  2. waiting:    vllm:num_requests_waiting p50 (metrics, in the cell's window) > waiting_p50_max (1)
  3. ttft_growth: TTFT p90(r) / TTFT p90(r') > ttft_p90_ratio_max (1.5), r' = the largest
     Phase A rate <= r/2 that this config has (exactly r/2 on the study's doubling grid; the
     output says which r' was used and whether it was an exact half; no such rate: not evaluated).
A criterion on too small a sample is not judged (fired None, with a note): fewer than
min_requests (20) requests post warm-up (criterion 1) or TTFT samples in either cell (3), fewer
than min_scrapes (3) scrapes (2). A cell none of whose criteria could be judged is "unknown":
never a knee, never a reference rate.

Criterion 3 compares the two cells' TTFT p90 intervals, not their point estimates: it fires when
the ratio's interval lies above the threshold, and a straddling interval leaves the cell
"unknown" unless another criterion fires (point estimates only where a cell has no interval).
A cell the validity gate marked invalid (measured while the host or the instrument perturbed it)
is "unknown" too, whatever its criteria say, and r' is the largest *valid* rate <= r/2: a
perturbed cell never feeds a knee or a reference rate. `ref_safe_perturbed` / `ref_load_perturbed`
list the perturbed cells that could have moved each rate.

Criterion 1's denominator: the study as planned writes effective_throughput(r) / r. With Poisson arrivals
the number of requests actually offered in a finite window deviates from r * window by about
1/sqrt(N) (7 % at N = 200), which alone would fire the 0.95 threshold on an idle server a
quarter of the time. So the default basis is the rate offered in the measurement window (the
load generator's effective / offered_in_window ratio), which is r in expectation;
throughput_basis="requested" gives the literal effective / r. Both ratios are in every output.

The reference rates these verdicts feed: reference_rates.py.
"""

from __future__ import annotations

from typing import Any

from connector_tax.analysis.constants import CRIT_THROUGHPUT, CRIT_TTFT, CRIT_WAITING
from connector_tax.config import PHASE_A, Saturation

EPS = 1e-9  # rates within this are equal (r/2 on a doubling grid, a limit)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def cell_criteria(
    row: dict[str, Any], t: Saturation, basis: str = "offered", lower: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The three criteria of one cell by the study's thresholds `t`. `lower` is the row at r'
    (criterion 3), or None."""
    ratio_off, ratio_req = _num(row.get("throughput_ratio")), _num(row.get("throughput_ratio_requested"))
    if basis == "requested":
        value, used = ratio_req, "requested"
    else:
        value, used = (ratio_off, "offered") if ratio_off is not None else (ratio_req, "requested")
    crit: dict[str, Any] = {
        CRIT_THROUGHPUT: {
            "value": value,
            "basis": used,
            "threshold": t.throughput_ratio_min,
            "rule": "value < threshold",
            "effective_rps": _num(row.get("effective_rps")),
            "offered_rps": _num(row.get("offered_rps")),
            "requested_rps": _num(row.get("requested_rps")),
            "ratio_offered": ratio_off,
            "ratio_requested": ratio_req,
            "fired": None if value is None else bool(value < t.throughput_ratio_min),
        },
        CRIT_WAITING: {
            "value": _num(row.get("waiting_p50")),
            "threshold": t.waiting_p50_max,
            "rule": "value > threshold",
            "samples": row.get("metrics_n"),
            "fired": None if _num(row.get("waiting_p50")) is None else bool(row["waiting_p50"] > t.waiting_p50_max),
        },
    }
    _too_few(crit[CRIT_THROUGHPUT], _num(row.get("n_post_warmup")), t.min_requests, "requests post warm-up")
    _too_few(crit[CRIT_WAITING], _num(row.get("metrics_n")), t.min_scrapes, "/metrics scrapes")
    if row.get("phase") == PHASE_A:
        c3: dict[str, Any] = {
            "threshold": t.ttft_p90_ratio_max,
            "rule": "value > threshold",
            "value": None,
            "fired": None,
            "ttft_p90_ms": _num(row.get("ttft_ms_p90")),
            "vs_rate": None,
            "vs_ttft_p90_ms": None,
            "exact_half": None,
        }
        rate = _num(row.get("rate"))
        if lower is None:
            c3["note"] = "no Phase A rate <= r/2 to compare with"
        else:
            lo_rate, lo_ttft, hi_ttft = _num(lower.get("rate")), _num(lower.get("ttft_ms_p90")), c3["ttft_p90_ms"]
            c3.update(
                vs_rate=lo_rate,
                vs_ttft_p90_ms=lo_ttft,
                exact_half=bool(rate is not None and lo_rate is not None and abs(lo_rate - rate / 2) < EPS),
            )
            if not c3["exact_half"] and rate is not None:
                c3["note"] = f"r/2 = {rate / 2:g} not measured; compared with the nearest lower rate {lo_rate:g}"
            if lo_ttft and hi_ttft is not None and lo_ttft > 0:
                c3["value"] = hi_ttft / lo_ttft
                _growth_by_intervals(c3, row, lower, t.ttft_p90_ratio_max)
                n = min(_num(row.get("ttft_ms_n")) or 0.0, _num(lower.get("ttft_ms_n")) or 0.0)
                _too_few(c3, n, t.min_requests, "TTFT samples in one of the two cells")
        crit[CRIT_TTFT] = c3
    fired = [name for name, c in crit.items() if c["fired"]]
    evaluable = [name for name, c in crit.items() if c["fired"] is not None]
    undecided = [name for name, c in crit.items() if c.get("undecided")]
    out: dict[str, Any] = {"saturated": bool(fired) if evaluable else None, "fired": fired, "criteria": crit}
    if not fired and undecided:
        # Growth that the intervals can neither show nor rule out: the cell is neither a knee
        # nor a rate below one (never a reference rate); its neighbours decide.
        out["saturated"], out["undecided"] = None, undecided
    if row.get("valid") is False:
        # Measured while perturbed (the validity gate): its criteria are shown, never used. A
        # perturbed cell is no knee and no reference rate.
        out["saturated"], out["perturbed"] = None, row.get("validity_reasons") or "invalid"
    return out


def _growth_by_intervals(c3: dict[str, Any], row: dict[str, Any], lower: dict[str, Any], threshold: float) -> None:
    """Criterion 3 on the two cells' TTFT p90 intervals: fired when the ratio's interval
    (lower bound over upper bound, upper over lower) lies above the threshold, not fired when it
    lies at or below it, undecided (fired None) when it straddles it. One stalled stretch makes a
    p90 jump in a short cell: a point estimate would call that a knee. With no interval for one of
    the two cells (too few TTFTs for batch means) the point estimates are compared, and `basis` says so."""
    hi_lo, hi_hi = _num(row.get("ttft_ms_p90_ci_lo")), _num(row.get("ttft_ms_p90_ci_hi"))
    lo_lo, lo_hi = _num(lower.get("ttft_ms_p90_ci_lo")), _num(lower.get("ttft_ms_p90_ci_hi"))
    if hi_lo is None or hi_hi is None or lo_lo is None or lo_hi is None or lo_lo <= 0 or not lo_hi:
        c3["basis"] = "point estimates (no interval for one of the two cells)"
        c3["fired"] = bool(c3["value"] > threshold)
        return
    ci = [max(0.0, hi_lo) / lo_hi, hi_hi / lo_lo]
    c3["ci"], c3["basis"] = ci, "intervals"
    if ci[0] > threshold:
        c3["fired"] = True
    elif ci[1] <= threshold:
        c3["fired"] = False
    else:
        c3["fired"], c3["undecided"] = None, True
        c3["note"] = (
            f"the ratio's interval [{ci[0]:.3g}, {ci[1]:.3g}] straddles {threshold:g}: growth neither shown nor ruled out"
        )


def _too_few(criterion: dict[str, Any], n: float | None, minimum: int, what: str) -> None:
    """Leave a criterion unjudged (fired None) when its sample is too small to mean anything;
    a sample size the row does not give is not held against it."""
    if n is not None and n < minimum and criterion["fired"] is not None:
        criterion["fired"] = None
        criterion["note"] = f"too few to judge: {n:g} {what} < {minimum:g}"


def _lower_row(rows: dict[float, dict[str, Any]], rate: float) -> dict[str, Any] | None:
    """The row criterion 3 compares with: the largest rate <= r/2 measured cleanly (a perturbed
    cell's TTFT is no baseline for growth)."""
    cands = [r for r in rows if r <= rate / 2 + EPS and rows[r].get("valid") is not False]
    return rows[max(cands)] if cands else None


def phase_a_saturation_by_launch(
    rows: list[dict[str, Any]], thresholds: Saturation, basis: str = "offered"
) -> dict[tuple[str, int], dict[float, dict[str, Any]]]:
    """{(variant, replicate): {rate: cell_criteria}} over the Phase A rows: each launch judged on
    its own cells (criterion 3 compares two cells of the same launch)."""
    by_launch: dict[tuple[str, int], dict[float, dict[str, Any]]] = {}
    for row in rows:
        if row.get("phase") == PHASE_A and _num(row.get("rate")) is not None:
            by_launch.setdefault((row["variant"], int(row.get("replicate") or 1)), {})[float(row["rate"])] = row
    return {
        launch: {
            rate: cell_criteria(row, thresholds, basis, _lower_row(cells, rate)) for rate, row in sorted(cells.items())
        }
        for launch, cells in by_launch.items()
    }


def phase_a_saturation(
    rows: list[dict[str, Any]], thresholds: Saturation, basis: str = "offered"
) -> dict[str, dict[float, dict[str, Any]]]:
    """{config: {rate: cell_criteria}} over the Phase A rows. With replicates, a rate is saturated
    for a variant if any of its launches was saturated there (the reference rates must hold for
    every launch), unsaturated if one was judged and none saturated; `replicates` says each one's."""
    per_launch = phase_a_saturation_by_launch(rows, thresholds, basis)
    out: dict[str, dict[float, dict[int, dict[str, Any]]]] = {}  # {variant: {rate: {replicate: verdict}}}
    for (name, replicate), cells in sorted(per_launch.items()):
        for rate, sat in cells.items():
            out.setdefault(name, {}).setdefault(rate, {})[replicate] = sat
    merged: dict[str, dict[float, dict[str, Any]]] = {}
    for name, by_rate in out.items():
        merged[name] = {}
        for rate, by_rep in sorted(by_rate.items()):
            if len(by_rep) == 1:
                merged[name][rate] = next(iter(by_rep.values()))
                continue
            pick = next((s for s in by_rep.values() if s["saturated"]), None) or next(
                (s for s in by_rep.values() if s["saturated"] is False), next(iter(by_rep.values()))
            )
            merged[name][rate] = {**pick, "replicates": {str(r): s["saturated"] for r, s in by_rep.items()}}
    return merged


def apply_to_row(row: dict[str, Any], sat: dict[str, Any]) -> None:
    """Copy a cell's saturation verdict into its aggregate row."""
    crit = sat["criteria"]
    row["saturated"] = sat["saturated"]
    row["saturation_criteria"] = ";".join(sat["fired"])
    row["crit_throughput"] = crit[CRIT_THROUGHPUT]["fired"]
    row["crit_waiting"] = crit[CRIT_WAITING]["fired"]
    if CRIT_TTFT in crit:
        row["crit_ttft_growth"] = crit[CRIT_TTFT]["fired"]
        row["ttft_growth_ratio"] = crit[CRIT_TTFT]["value"]
        row["ttft_growth_vs_rate"] = crit[CRIT_TTFT]["vs_rate"]
