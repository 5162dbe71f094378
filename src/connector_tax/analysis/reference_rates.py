"""The reference rates from the Phase A cells' saturation verdicts (saturation.py).

Reference rates (docs/study-design.md, Phase A):
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

from connector_tax.analysis.constants import PLAIN
from connector_tax.analysis.saturation import EPS, phase_a_saturation
from connector_tax.config import PHASE_A, Saturation


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
        if s.get("perturbed") and limit is not None and r <= limit + EPS
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
    from connector_tax.analysis.usable_cells import load_study, phase_completed

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
