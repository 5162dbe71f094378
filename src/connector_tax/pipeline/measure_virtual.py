"""A phase launch of a virtual-time study (`sim.clock: virtual`): no server, each cell computed.

The cells are planned, pruned, fingerprinted, staged and sealed exactly as measure.py does for
a real launch, with the same precision watch and overload guard deciding when a cell ends; only
the cell itself is run by the simulator in virtual time (oracle/virtual_cell.py) instead of by the
load generator against a `ctax sim` server. A cell's `wall_s` is its virtual duration (what the
cell would take on the modelled hardware), `compute_s` what computing it took here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from connector_tax.contract import StudyLayout
from connector_tax.contract.fingerprint import METRICS_INTERVAL_S
from connector_tax.contract.index import PhaseIndex
from connector_tax.oracle.virtual_cell import VirtualCell
from connector_tax.pipeline.measure import cell_spec, loadgen_options, overload_guard, prune_from, seal_measured
from connector_tax.pipeline.plan import PlannedCell
from connector_tax.pipeline.precision import PrecisionWatch
from connector_tax.sim.settings import resolve


def measure_virtual(
    config: dict[str, Any],
    variant: dict[str, Any],
    layout: StudyLayout,
    index: PhaseIndex,
    pending: list[PlannedCell],
    save: Callable[[], None],
    prune: Callable[[PlannedCell], str | None],
) -> None:
    settings = resolve(config, variant, {})
    options = loadgen_options(config, "virtual:")
    index.launch_command = None
    index.step_timing_available, index.step_timing_reason = True, None  # the engine model writes every step
    while pending:
        planned = pending.pop(0)
        cell = planned.cell
        folder = layout.phase(index.config, cell.phase)
        staging, final = folder.staging(cell.label), folder.cell(cell.label)
        staging.folder.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic_ns()
        precision = PrecisionWatch(staging.requests, cell.precision_target)
        waiting: list[tuple[float, float]] = []
        guard = overload_guard(SimpleNamespace(waiting=waiting), t0 / 1e9 + cell.warmup_s, config["saturation"], cell)
        print(f"  {index.config}/{cell.key}: computing in virtual time", flush=True)
        summary = VirtualCell(
            settings,
            cell_spec(planned),
            options,
            staging,
            t0,
            enough=precision.check,
            give_up=guard.overloaded,
            waiting=waiting,
            metrics_interval_s=METRICS_INTERVAL_S,
        ).run()
        seal_measured(index, planned, staging, final, summary, None, precision.describe(summary, guard))
        prune_from(index, pending, prune)
        save()
