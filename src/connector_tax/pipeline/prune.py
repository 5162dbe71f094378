"""Cells not worth measuring: Phase A past a configuration's knee, Phase B' on a shape the server
could not take at ref_safe.

Knee pruning: once a configuration is saturated at a rate, higher rates are not measured
(unless `workload.phase_a.prune_after_knee: false`).

Phase A's cells run from the lowest rate up. After each complete cell, the design's three
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
from connector_tax.analysis.layout import Measurement
from connector_tax.analysis.saturation import cell_criteria
from connector_tax.config import StudyConfig
from connector_tax.contract import StudyLayout
from connector_tax.contract.index import PRUNED, read_summary
from connector_tax.pipeline.plan import CellPlan


def _row(layout: StudyLayout, study: StudyConfig, name: str, planned: CellPlan) -> dict[str, Any]:
    files = layout.phase(name, planned.cell.phase, planned.cell.replicate).cell(planned.cell.label)
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
    """Which of the design's criteria fire for a complete cell (criterion 3 against `lower`,
    Phase A only), as a phrase; None when it is not saturated."""
    lower_row = _row(layout, study, name, lower) if lower else None
    verdict = cell_criteria(_row(layout, study, name, planned), study.saturation, "offered", lower_row)
    if not verdict["saturated"]:
        return None
    return ", ".join(
        f"{c} {verdict['criteria'][c]['value']:.3g} vs {verdict['criteria'][c]['threshold']:g}"
        for c in verdict["fired"]
    )


def knee(layout: StudyLayout, study: StudyConfig, name: str, done: list[CellPlan]) -> str | None:
    """Why the highest of `done` (complete Phase A cells, ascending rates) is saturated, or None."""
    if not done or not study.workload.phase_a.prune_after_knee:
        return None
    top = done[-1]
    lower = [p for p in done[:-1] if p.cell.rate <= top.cell.rate / 2 + 1e-9]
    fired = saturated(layout, study, name, top, lower[-1] if lower else None)
    return None if fired is None else f"{PRUNED}: saturated at {top.cell.label} ({fired})"


def overloaded_shape(layout: StudyLayout, study: StudyConfig, name: str, shape_cell: CellPlan) -> str | None:
    """Phase B' runs a shape at ref_load (>= ref_safe): one saturated at ref_safe in Phase B is cut."""
    fired = saturated(layout, study, name, shape_cell)
    return (
        None
        if fired is None
        else (f"{PRUNED}: the shape was saturated at ref_safe in Phase B ({fired}); cut from Phase B'")
    )
