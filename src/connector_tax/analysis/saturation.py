"""Saturation of each cell (the design's three criteria, which fired) and the reference rates.

A cell at rate r is saturated if ANY of:
  1. throughput: effective throughput / offered rate < throughput_ratio_min (0.95)
  2. waiting:    vllm:num_requests_waiting p50 (metrics, in the cell's window) > waiting_p50_max (1)
  3. ttft_growth: TTFT p90(r) / TTFT p90(r') > ttft_p90_ratio_max (1.5), r' = the largest
     Phase A rate <= r/2 that this config has (exactly r/2 on the design's doubling grid; the
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

Criterion 1's denominator: the design writes effective_throughput(r) / r. With Poisson arrivals
the number of requests actually offered in a finite window deviates from r * window by about
1/sqrt(N) (7 % at N = 200), which alone would fire the 0.95 threshold on an idle server a
quarter of the time. So the default basis is the rate offered in the measurement window (the
load generator's effective / offered_in_window ratio), which is r in expectation;
throughput_basis="requested" gives the literal effective / r. Both ratios are in every output.

Reference rates (design, "Reference rate selection"):
  per-config saturation rate = the lowest rate at which the cell is saturated;
  ref_safe = the largest rate below the saturation rate of EVERY config that completed
             Phase A (each of them has an unsaturated cell there);
  ref_load = the largest rate below the baseline's ("plain", else the study's first config)
             saturation rate.
"Below the saturation rate" rather than "any unsaturated cell" keeps a noisy unsaturated cell
above a knee from being picked; such non-monotone cells are listed in `notes`.
When no rate qualifies, the rate is the lowest Phase A rate, `*_flagged` is true and
`*_reason` says why in one line.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from connector_tax.analysis.constants import CRIT_THROUGHPUT, CRIT_TTFT, CRIT_WAITING, PLAIN
from connector_tax.config import PHASE_A, Saturation

_EPS = 1e-9


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
                exact_half=bool(rate is not None and lo_rate is not None and abs(lo_rate - rate / 2) < _EPS),
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
    cands = [r for r in rows if r <= rate / 2 + _EPS and rows[r].get("valid") is not False]
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


def _describe(rate: float, sat: dict[str, Any] | None) -> str:
    if sat is None:
        return f"r{rate:g}: no cell"
    if sat.get("perturbed"):
        return f"r{rate:g}: measured while perturbed ({sat['perturbed']})"
    if sat.get("undecided"):
        return f"r{rate:g}: " + "; ".join(sat["criteria"][c].get("note", c) for c in sat["undecided"])
    if sat["saturated"] is None:
        return f"r{rate:g}: no criterion could be evaluated"
    parts = []
    for name in sat["fired"]:
        c = sat["criteria"][name]
        parts.append(f"{name} {c['value']:.3g} vs {c['threshold']:g}")
    return f"r{rate:g}: " + (", ".join(parts) if parts else "not saturated")


def select_reference(
    saturation: dict[str, dict[float, dict[str, Any]]],
    rates: list[float],
    considered: list[str],
    excluded: dict[str, str],
    baseline: str,
) -> dict[str, Any]:
    """ref_safe / ref_load from per-cell saturation; every decision with its numbers."""
    rates = sorted(set(rates) | {r for c in considered for r in saturation.get(c, {})})
    per_variant: dict[str, Any] = {}
    notes: list[str] = []
    for name in considered:
        cells = saturation.get(name, {})
        sat_rates = [r for r, s in sorted(cells.items()) if s["saturated"]]
        first = sat_rates[0] if sat_rates else None
        after = [r for r, s in sorted(cells.items()) if first is not None and r > first and s["saturated"] is False]
        if after:
            notes.append(
                f"{name}: not saturated at {', '.join(f'r{r:g}' for r in after)} above its saturation "
                f"rate r{first:g} (noise or recovery); the lowest saturated rate is used"
            )
        per_variant[name] = {
            "saturation_rate": first,
            "fired_at_saturation": cells[first]["fired"] if first is not None else [],
            "unsaturated_rates": [r for r, s in sorted(cells.items()) if s["saturated"] is False],
            "unknown_rates": [r for r, s in sorted(cells.items()) if s["saturated"] is None],
            "perturbed_rates": [r for r, s in sorted(cells.items()) if s.get("perturbed")],
            "missing_rates": [r for r in rates if r not in cells],
        }

    def below_knee(name: str, rate: float) -> bool:
        cell = saturation.get(name, {}).get(rate)
        knee = per_variant[name]["saturation_rate"]
        return cell is not None and cell["saturated"] is False and (knee is None or rate < knee)

    def blockers(names: list[str], rate: float) -> list[str]:
        return [f"{n} {_describe(rate, saturation.get(n, {}).get(rate))}" for n in names if not below_knee(n, rate)]

    lowest = rates[0] if rates else None
    out: dict[str, Any] = {
        "rates": rates,
        "baseline": baseline,
        "variants_considered": considered,
        "variants_excluded": excluded,
        "per_variant": per_variant,
        "notes": notes,
    }

    safe = [r for r in rates if considered and all(below_knee(n, r) for n in considered)]
    if safe:
        out.update(ref_safe=max(safe), ref_safe_flagged=False, ref_safe_reason=None)
    else:
        if not considered:
            why = "no config completed Phase A"
        elif lowest is None:
            why = "no Phase A rate"
        else:
            why = "no Phase A rate is below every config's saturation rate; at the lowest rate: " + "; ".join(
                blockers(considered, lowest)
            )
        out.update(ref_safe=lowest, ref_safe_flagged=True, ref_safe_reason=why)
    out["ref_safe_basis"] = {
        "rule": "max rate r such that every considered config is unsaturated at r and r < its saturation rate",
        "candidates": safe,
        "blocked_above": (lambda above: {f"r{r:g}": blockers(considered, r) for r in above})(
            [r for r in rates if out["ref_safe"] is not None and r > out["ref_safe"]]
        ),
    }

    _rests_on_perturbed(out, saturation, considered, rates, "ref_safe")
    if baseline in considered:
        load = [r for r in rates if below_knee(baseline, r)]
        if load:
            out.update(ref_load=max(load), ref_load_flagged=False, ref_load_reason=None)
        else:
            why = (
                f"{baseline} is saturated at every Phase A rate; at the lowest: "
                + "; ".join(blockers([baseline], lowest))
                if lowest is not None
                else "no Phase A rate"
            )
            out.update(ref_load=lowest, ref_load_flagged=True, ref_load_reason=why)
        out["ref_load_basis"] = {
            "rule": f"max rate r such that {baseline} is unsaturated at r and r < its saturation rate",
            "variant": baseline,
            "candidates": load,
        }
    else:
        out.update(
            ref_load=lowest,
            ref_load_flagged=True,
            ref_load_reason=f"baseline {baseline!r} did not complete Phase A; ref_load = lowest rate",
        )
        out["ref_load_basis"] = {"rule": "baseline missing", "variant": baseline, "candidates": []}
    _rests_on_perturbed(out, saturation, [baseline] if baseline in considered else [], rates, "ref_load")
    return out


def _rests_on_perturbed(
    out: dict[str, Any],
    saturation: dict[str, dict[float, dict[str, Any]]],
    names: list[str],
    rates: list[float],
    ref: str,
) -> None:
    """`<ref>_perturbed`: the perturbed Phase A cells that could have moved the rate: those at or
    below it, and at the next rate up (clean, it might have been the rate). Empty: the rate rests
    on clean cells only."""
    rate = out.get(ref)
    above = [r for r in rates if rate is not None and r > rate]
    limit = min(above) if above else rate
    out[f"{ref}_perturbed"] = [
        f"{n}/r{r:g}"
        for n in names
        for r, s in sorted(saturation.get(n, {}).items())
        if s.get("perturbed") and limit is not None and r <= limit + _EPS
    ]


def _jsonable_cells(saturation: dict[str, dict[float, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {
        name: {f"r{rate:g}": {"rate": rate, **sat} for rate, sat in cells.items()} for name, cells in saturation.items()
    }


def reference_from_rows(
    rows: list[dict[str, Any]],
    variants: list[str],
    completed: dict[str, str | None],
    rates: list[float],
    thresholds: Saturation,
    baseline: str = PLAIN,
    basis: str = "offered",
    simulated: bool = False,
) -> dict[str, Any]:
    """The reference-rate document from already computed Phase A rows.

    completed: {config: None if it completed Phase A else the reason it did not}."""
    saturation = phase_a_saturation(rows, thresholds, basis)
    considered = [c for c in variants if completed.get(c, "absent") is None]
    excluded = {c: (completed.get(c) or "no Phase A results") for c in variants if c not in considered}
    if baseline not in variants and variants:
        chosen = considered[0] if considered else variants[0]
        note = f"no config named {baseline!r}: ref_load uses the study's first config, {chosen!r}"
        baseline = chosen
    else:
        note = None
    doc = select_reference(saturation, rates, considered, excluded, baseline)
    if note:
        doc["notes"].insert(0, note)
    doc.update(
        schema_version=1,
        simulated=simulated,
        thresholds=asdict(thresholds),
        throughput_basis=basis,
        ttft_growth_comparison="TTFT p90(r) / TTFT p90(r'), r' = the largest measured Phase A rate <= r/2 "
        "(exact_half says whether r' = r/2)",
        cells=_jsonable_cells(saturation),
    )
    return doc


def reference_rates(results_dir: Path, *, baseline: str = PLAIN, throughput_basis: str = "offered") -> dict[str, Any]:
    """The pipeline's reference stage: saturation of every Phase A cell of the study under
    results_dir (= results/<study>, as its study_config.yaml plans it) and ref_safe / ref_load,
    JSON-serializable. Reads request records, summaries and metrics; never step logs."""
    from connector_tax.analysis.cellstats import cell_row
    from connector_tax.analysis.layout import load_study, phase_completed

    study = load_study(Path(results_dir))
    rows = []
    for cell in study.cells(PHASE_A):
        run = study.run_of(cell.variant, PHASE_A, cell.replicate)
        row, _ = cell_row(
            cell,
            backend=study.backend,
            simulated=study.simulated,
            run_status=run.status if run else "missing",
            step_timing_available=False,
            steps=False,
        )
        rows.append(row)
    completed = {name: phase_completed(study, name, PHASE_A)[1] for name in study.variants}
    return reference_from_rows(
        rows,
        study.variants,
        completed,
        study.phase_a_rates,
        study.settings.saturation,
        baseline=baseline,
        basis=throughput_basis,
        simulated=study.simulated,
    )
