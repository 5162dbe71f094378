"""Knee pruning in Phase A: once a configuration is saturated at a rate, higher rates are not
measured (unless `workload.phase_a.prune_after_knee: false`).

Phase A's cells run from the lowest rate up. After each complete cell, the design's three
saturation criteria are evaluated on it exactly as the reference stage will (analysis.saturation
on the cell's sealed files; criterion 3 against the highest complete rate <= r/2). A saturated
cell is the configuration's knee: every higher rate is recorded as `pruned` with the knee and
the criteria that fired, never as failed, and is not measured — hours of GPU time on a server
that is past its knee buy nothing the reference rates use.
"""

from __future__ import annotations

from typing import Any

from connector_tax.analysis.cellstats import cell_row
from connector_tax.analysis.layout import Cell
from connector_tax.analysis.saturation import cell_criteria
from connector_tax.contract import PHASE_A, StudyLayout
from connector_tax.contract.index import PRUNED, read_summary
from connector_tax.pipeline.plan import PlannedCell


def _row(layout: StudyLayout, config: dict[str, Any], name: str, planned: PlannedCell) -> dict[str, Any]:
    files = layout.phase(name, PHASE_A).cell(planned.cell.label)
    cell = Cell(name, PHASE_A, planned.cell.label, files, planned.cell, read_summary(files))
    row, _ = cell_row(cell, backend=config["backend"], simulated=config["backend"] == "sim", run_status="ok",
                      step_timing_available=False, steps=False)  # fmt: skip
    return row


def knee(layout: StudyLayout, config: dict[str, Any], name: str, done: list[PlannedCell]) -> str | None:
    """Why the highest of `done` (complete Phase A cells, ascending rates) is saturated, or None."""
    if not done or not config["workload"]["phase_a"].get("prune_after_knee", True):
        return None
    top = done[-1]
    lower = [p for p in done[:-1] if p.cell.rate <= top.cell.rate / 2 + 1e-9]
    verdict = cell_criteria(_row(layout, config, name, top), config["saturation"], "offered",
                            _row(layout, config, name, lower[-1]) if lower else None)  # fmt: skip
    if not verdict["saturated"]:
        return None
    fired = ", ".join(f"{c} {verdict['criteria'][c]['value']:.3g} vs {verdict['criteria'][c]['threshold']:g}"
                      for c in verdict["fired"])  # fmt: skip
    return f"{PRUNED}: saturated at {top.cell.label} ({fired})"
