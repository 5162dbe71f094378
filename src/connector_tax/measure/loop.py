"""The measuring loop of a phase: the cells it could not reuse, each run by a runner (a server
in real time, or the simulator in virtual time: runners.py) and sealed as it ends.

Per cell: a staging folder receives the records, summary, /metrics scrapes and step-log slice;
then `seal_cell` moves them into the phase folder, summary last. The index (run.json) is
rewritten after every cell, so a kill at any moment leaves it true. A cell's length past its
floor is the precision watch's (precision.py) and the overload guard's call, whichever clock runs it.

A cell during which the server exited or got stuck (the runner says which), or a load-generator
worker died, is sealed as failed with the reason; the server and load generator are launched
anew for the next cell, at most MAX_RESTARTS times per phase job (each restart recorded in the
index). A cell in which no request succeeded is failed too. Failed cells keep their records for
a person to read and are redone on the next run.

Every attempt passes the validity gate (gate.py: the instrument's checks and the host's
contention). One perturbed by the host or the instrument's timing is measured again, up to
`validity.attempts` times, each attempt in its own staging folder; so is a Phase A cell that
`suspect` says must be seen twice before it may become a knee (saturation criterion 3 alone,
with throughput and queue clean). The attempt that stands is sealed (its summary lists every
attempt); the others go to superseded/ with the reason each was set aside.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec

from connector_tax.config import PHASE_A, Cell, Saturation, Validity
from connector_tax.contract import StudyLayout
from connector_tax.contract.index import COMPLETE, FAILED, PRUNED, PhaseIndex, move_aside, seal_cell
from connector_tax.contract.layout import CellFiles, now_iso
from connector_tax.contract.summary import CellSummary
from connector_tax.measure.cellplan import CellPlan
from connector_tax.measure.gate import Attempt, choose, judge, remeasure_reason
from connector_tax.measure.precision import OverloadGuard, PrecisionWatch
from connector_tax.measure.runners import Runner, Waiting

MAX_RESTARTS = 2  # server launches after the first, per phase job


class ServerDied(RuntimeError):
    """The server failed more often than a launch may restart it."""


def _verdict(summary: CellSummary, failure: str | None) -> tuple[str, str | None]:
    if failure:
        return FAILED, failure
    if summary.counts.post_warmup > 0 and summary.counts.ok == 0:
        return FAILED, "no request succeeded"
    return COMPLETE, None


# Why a measured attempt must be seen again before it counts (its staging files, its plan), or None.
Suspect = Callable[[CellPlan, CellFiles], str | None]


def _never(*_: object) -> None:
    return None


@dataclass(frozen=True)
class Policies:
    """What the measuring loop asks of the study about a phase's cells, in one place: the
    saturation thresholds (the overload guard) and the validity gate; `prune`: why a cell, when
    its turn comes, is not worth measuring (recorded as pruned); `pair_with`: the baseline's
    sealed requests a cell that stops on its taxes is paired with; `suspect`: why a valid attempt
    must be measured once more before it counts. pipeline.phase makes the study's."""

    saturation: Saturation
    validity: Validity
    prune: Callable[[CellPlan], str | None] = _never
    pair_with: Callable[[Cell], Path | None] = _never
    suspect: Suspect = _never


def measure(
    runner: Runner,
    layout: StudyLayout,
    index: PhaseIndex,
    todo: list[CellPlan],
    save: Callable[[], None],
    policies: Policies,
) -> None:
    """Measure `todo` in order, launching again after a failure, by the phase's `policies`."""
    pending = list(todo)
    prune = policies.prune
    prune_from(index, pending, prune)
    if not pending:
        return
    with runner:
        while pending:
            failure = None
            with runner.launch(index, save) as launched:
                while pending and failure is None:
                    planned = pending.pop(0)
                    failure = _measure_cell(layout, index, planned, launched, policies, save)
                    prune_from(index, pending, prune)
                    save()
            if failure is None:
                return
            index.restarts.append({"at": now_iso(), "after": failure})
            save()
            if len(index.restarts) > MAX_RESTARTS:
                raise ServerDied(f"server failed {len(index.restarts)} times; last: {failure}")


def prune_from(index: PhaseIndex, pending: list[CellPlan], prune: Callable[[CellPlan], str | None]) -> None:
    """Record as pruned, not measured, the next pending cells `prune` gives a reason for."""
    while pending and (why := prune(pending[0])) is not None:
        entry = index.cell(pending[0].cell.phase, pending[0].cell.label)
        if entry is not None:
            entry.status, entry.reason = PRUNED, why
        pending.pop(0)


def _measure_cell(
    layout: StudyLayout,
    index: PhaseIndex,
    planned: CellPlan,
    launched: Any,
    policies: Policies,
    save: Callable[[], None],
) -> str | None:
    """Measure one cell until an attempt passes the gate (or the attempts are spent), seal the
    one that stands, set the others aside; returns why the server failed during it, if it did."""
    cell = planned.cell
    validity = policies.validity
    pair_with = policies.pair_with(cell)
    folder = layout.phase(index.variant, cell.phase, index.replicate)
    attempts: list[Attempt] = []
    suspected = False
    for number in range(1, validity.attempts + 1):
        attempt = _attempt(folder.staging(cell.label, number), planned, launched, policies, number, pair_with)
        attempts.append(attempt)
        if attempt.failure is not None or number == validity.attempts:
            break
        why = remeasure_reason(attempt.summary)
        if why is None and attempt.valid and not suspected:
            why = policies.suspect(planned, attempt.staging)
            suspected = why is not None
        if why is None:
            break
        attempt.set_aside = why
        print(f"  {cell.key}: attempt {number} {why}; measuring it again", flush=True)
        index.superseded.append({"cell": cell.key, "attempt": number, "reason": why, "to": None})
        save()
    stands = choose(attempts)
    history = [a.describe() for a in attempts]
    for a in attempts:
        if a is stands:
            continue
        why = a.set_aside or f"attempt {stands.number} stands (less perturbed)"
        tag = "ttft-growth" if a.set_aside and "criterion 3" in a.set_aside else "perturbed"
        dest = move_aside(
            a.staging.existing(),
            folder.superseded(cell.label, f"{tag}-{a.number}"),
            {
                "cell": cell.key,
                "attempt": a.number,
                "reason": why,
                "stands": stands.number,
                "attempts": msgspec.to_builtins(history),
            },
        )
        _rmdir(a.staging.folder)
        note = next((e for e in index.superseded if e.get("cell") == cell.key and e.get("attempt") == a.number), None)
        if note is None:
            index.superseded.append(note := {"cell": cell.key, "attempt": a.number, "reason": why})
        note["to"] = str(dest)
    stands.summary.attempts = history
    seal_measured(index, planned, stands.staging, folder.cell(cell.label), stands.summary, stands.failure)
    return stands.failure


def _attempt(
    staging: CellFiles,
    planned: CellPlan,
    launched: Any,
    policies: Policies,
    number: int,
    pair_with: Path | None = None,
) -> Attempt:
    """One measurement of the cell into `staging`, judged by the gate; a cell that stops on its
    taxes is paired with the baseline's sealed requests at `pair_with`."""
    cell = planned.cell
    staging.folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic_ns()
    waiting: Waiting = []
    precision = PrecisionWatch(staging.requests, cell.precision_target, pair_with)
    # Phase B and B' cells end at their floor when saturated, unless the study turned it off.
    guard = OverloadGuard(
        waiting,
        t0 / 1e9 + cell.warmup_s,
        policies.saturation.waiting_p50_max,
        cell.phase != PHASE_A and cell.overload_guard,
    )
    # A later attempt sends fresh prompts: the server's prefix cache holds the earlier ones.
    summary, failure = launched.run(replace(cell, attempt=number), staging, t0, precision, guard.overloaded, waiting)
    judge(summary, policies.validity)
    precision.describe(summary, guard)
    return Attempt(number, staging, summary, failure)


def _rmdir(folder: Any) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


def seal_measured(
    index: PhaseIndex,
    planned: CellPlan,
    staging: CellFiles,
    final: CellFiles,
    summary: CellSummary,
    failure: str | None,
) -> None:
    """Seal a measured cell (failed with `failure` if there was one) and note it in the index."""
    cell = planned.cell
    status, reason = _verdict(summary, failure)
    sealed = seal_cell(staging, final, planned.fingerprint, summary, status=status, reason=reason)
    entry = index.cell(cell.phase, cell.label)
    if entry is not None:
        entry.status = COMPLETE if sealed.complete else FAILED
        entry.reason = sealed.reason
        entry.counts = {k: v.records for k, v in (sealed.files or {}).items()}
