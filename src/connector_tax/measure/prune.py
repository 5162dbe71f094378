"""Cells not worth measuring: Phase A past a configuration's knee, Phase B' on a shape the server
could not take at ref_safe.

Knee pruning: once a configuration is saturated at a rate, higher rates are not measured
(unless `workload.phase_a.prune_after_knee: false`). A cell measured while perturbed (the
validity gate) is never a knee, and a cell whose only saturation sign is TTFT growth (criterion
3) with throughput and queue clean is measured once more before it may become one
(`ttft_growth_only`, measure.py's `suspect`).

Phase A's cells run from the lowest rate up. After each complete cell, the study's three
saturation criteria are evaluated on it exactly as the reference stage will (analysis.saturation
on the cell's sealed files; criterion 3 against the highest complete rate <= r/2). A saturated
cell is the configuration's knee: every higher rate is recorded as `pruned` with the knee and
the criteria that fired, never as failed, and is not measured — hours of GPU time on a server
that is past its knee buy nothing the reference rates use. Likewise a Phase B shape saturated
at ref_safe (criteria 1 and 2; the analysis leaves it out of H5/H6) is cut from Phase B', which
runs it at ref_load, a rate no lower.
"""

from __future__ import annotations

from typing import Any

from connector_tax.analysis.cellstats import cell_row
from connector_tax.analysis.constants import CRIT_THROUGHPUT, CRIT_TTFT, CRIT_WAITING
from connector_tax.analysis.saturation import cell_criteria
from connector_tax.analysis.usable_cells import Measurement
from connector_tax.config import PHASE_A, StudyConfig
from connector_tax.contract import CellFiles, StudyLayout
from connector_tax.contract.index import PRUNED, read_summary
from connector_tax.measure.cellplan import CellPlan


def _row(
    layout: StudyLayout, study: StudyConfig, name: str, planned: CellPlan, files: CellFiles | None = None
) -> dict[str, Any]:
    """The cell's aggregate row, from its sealed files (or `files`: an attempt not yet sealed)."""
    files = files or layout.phase(name, planned.cell.phase, planned.cell.replicate).cell(planned.cell.label)
    cell = Measurement(name, planned.cell.phase, planned.cell.label, files, planned.cell, read_summary(files))
    row, _ = cell_row(
        cell,
        backend=study.backend,
        simulated=study.backend == "sim",
        run_status="ok",
        step_timing_available=False,
        steps=False,
    )
    row["phase"] = planned.cell.phase
    return row


def saturated(
    layout: StudyLayout, study: StudyConfig, name: str, planned: CellPlan, lower: CellPlan | None = None
) -> str | None:
    """Which of the study's criteria fire for a complete cell (criterion 3 against `lower`,
    Phase A only), as a phrase; None when it is not saturated."""
    lower_row = _row(layout, study, name, lower) if lower else None
    verdict = cell_criteria(_row(layout, study, name, planned), study.saturation, "offered", lower_row)
    if not verdict["saturated"]:
        return None
    return ", ".join(
        f"{c} {verdict['criteria'][c]['value']:.3g} vs {verdict['criteria'][c]['threshold']:g}"
        for c in verdict["fired"]
    )


def valid(layout: StudyLayout, name: str, planned: CellPlan) -> bool:
    """Did the cell pass the validity gate (a sealed summary that does not say otherwise)?"""
    summary = read_summary(layout.phase(name, planned.cell.phase, planned.cell.replicate).cell(planned.cell.label))
    return summary is None or summary.validity.valid


def knee(layout: StudyLayout, study: StudyConfig, name: str, done: list[CellPlan]) -> str | None:
    """Why the highest of `done` (complete Phase A cells, ascending rates) is saturated, or None.
    A perturbed cell is no knee, and no baseline for criterion 3 (the analysis's rule too)."""
    if not done or not study.workload.phase_a.prune_after_knee:
        return None
    top = done[-1]
    lower = [p for p in done[:-1] if p.cell.rps <= top.cell.rps / 2 + 1e-9 and valid(layout, name, p)]
    fired = saturated(layout, study, name, top, lower[-1] if lower else None)
    return None if fired is None else f"{PRUNED}: saturated at {top.cell.label} ({fired})"


def ttft_growth_only(
    layout: StudyLayout, study: StudyConfig, name: str, planned: CellPlan, files: CellFiles, done: list[CellPlan]
) -> str | None:
    """Why a Phase A attempt (in `files`, not sealed yet) must be measured once more before it may
    become a knee: saturation criterion 3 (TTFT growth) fires while throughput and queue are
    clean. One stalled stretch of a short cell moves a p90 that much; throughput and queue would
    show a real knee too. A straddling interval is no knee, and another cell of the same size
    straddles as often (the second replaces the first): it stands "unknown" with one measurement.
    `done`: the complete cells below it."""
    if planned.cell.phase != PHASE_A:
        return None
    lower = [p for p in done if p.cell.rps <= planned.cell.rps / 2 + 1e-9 and valid(layout, name, p)]
    if not lower:
        return None
    row = _row(layout, study, name, planned, files)
    verdict = cell_criteria(row, study.saturation, "offered", _row(layout, study, name, lower[-1]))
    crit = verdict["criteria"]
    clean = crit[CRIT_THROUGHPUT]["fired"] is False and crit[CRIT_WAITING]["fired"] is False
    growth = crit[CRIT_TTFT]
    if not clean or not growth.get("fired"):
        return None
    shown = f"{growth['value']:.3g}" + (f" [{growth['ci'][0]:.3g}, {growth['ci'][1]:.3g}]" if growth.get("ci") else "")
    return (
        f"tripped only saturation criterion 3 (TTFT p90 growth {shown} vs {growth['threshold']:g} against "
        f"{lower[-1].cell.label}) with throughput and queue clean: measured again before it may become a knee"
    )


def overloaded_shape(layout: StudyLayout, study: StudyConfig, name: str, shape_cell: CellPlan) -> str | None:
    """Phase B' runs a shape at ref_load (>= ref_safe): one saturated at ref_safe in Phase B is cut."""
    fired = saturated(layout, study, name, shape_cell)
    return (
        None
        if fired is None
        else (f"{PRUNED}: the shape was saturated at ref_safe in Phase B ({fired}); cut from Phase B'")
    )
