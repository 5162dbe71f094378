"""What Snakemake asks of the study's launches before and after they run: each phase job's params
(its planned cells, their fingerprints and a retry token, so a change re-runs the job), the dry
run's "what will be measured and why" lines, and the closing line of a run. The plan itself is
the measuring package's (measure/cellplan.py): the Snakefile and the phase job compute the same one.
"""

from __future__ import annotations

from pathlib import Path

from connector_tax.config import PHASE_A, PHASE_B, StudyConfig, launch_label
from connector_tax.contract import StudyLayout
from connector_tax.contract.index import COMPLETE, DONE, PRUNED, PhaseIndex, read_index
from connector_tax.measure.cellplan import launch_plan, pending_cells, read_reference
from connector_tax.measure.gate import stands_perturbed


def retry_token(layout: StudyLayout, name: str, launch_phase: str, replicate: int = 1) -> str:
    """Non-empty while the last launch left cells failed, unfinished or standing perturbed (the
    validity gate): it names that launch, so each new attempt is a change Snakemake re-runs the
    job for."""
    index: PhaseIndex | None = read_index(layout.index(name, launch_phase, replicate))
    if index is None or index.status == "skipped":
        return ""
    if index.status == "running" or any(c.status not in DONE for c in index.cells):
        return f"retry after launch {index.launch_id} ({index.status})"
    perturbed = [
        c.key
        for c in index.cells
        if c.status == COMPLETE and stands_perturbed(layout.phase(name, c.phase, replicate).cell(c.label))
    ]
    if perturbed:
        return f"measure again after launch {index.launch_id}: {len(perturbed)} cells stand perturbed"
    return ""


def job_params(config_path: str | Path, study: StudyConfig, name: str, launch_phase: str, replicate: int = 1) -> str:
    """What the Snakemake job of (name, launch phase, replicate) is asked to produce: its planned
    cells and fingerprints, and a retry token. A change of either makes Snakemake run the job again."""
    layout = StudyLayout.of(study.study)
    reference = read_reference(layout) if launch_phase == PHASE_B else None
    if launch_phase == PHASE_B and reference is None:
        digest = "cells planned after the reference stage"
    else:
        digest = launch_plan(config_path, study, name, launch_phase, reference, replicate).digest
    return f"{digest} {retry_token(layout, name, launch_phase, replicate)}".strip()


def launches(study: StudyConfig) -> list[tuple[str, str, int]]:
    """Every (variant, launch phase, replicate) of the study."""
    return [
        (name, launch_phase, replicate)
        for name in study.names
        for launch_phase in (PHASE_A, PHASE_B)
        for replicate in range(1, study.workload.replicates + 1)
    ]


def describe_pending(config_path: str | Path, study: StudyConfig) -> list[str]:
    """One line per launch whose cells will be (re-)measured, with why, for a study that has
    results already (a dry run shows it before anything runs): a launch with no results yet (a
    variant or replicate added) is a new launch, every cell of it measured."""
    layout = StudyLayout.of(study.study)
    if not layout.root.is_dir():
        return []
    reference = read_reference(layout)
    lines = []
    for name, launch_phase, replicate in launches(study):
        if launch_phase == PHASE_B and reference is None:
            continue
        plan = launch_plan(config_path, study, name, launch_phase, reference, replicate)
        if read_index(layout.index(name, launch_phase, replicate)) is None:
            n = len(plan.cells)
            lines.append(f"{launch_label(name, replicate)}/{launch_phase}: {n} of {n} cells to measure — a new launch")
            continue
        pending = pending_cells(layout, plan)
        if pending:
            why = "; ".join(f"{key}: {reason}" for key, reason in list(pending.items())[:3])
            more = f" (+{len(pending) - 3} more)" if len(pending) > 3 else ""
            lines.append(
                f"{launch_label(name, replicate)}/{launch_phase}: {len(pending)} of {len(plan.cells)} "
                f"cells to measure — {why}{more}"
            )
    return lines


def study_outcome(study: StudyConfig) -> str:
    """The closing line of a study run: cells complete, and which failed or were skipped, why."""
    layout = StudyLayout.of(study.study)
    complete, pruned, problems = 0, 0, []
    for name, launch_phase, replicate in launches(study):
        index = read_index(layout.index(name, launch_phase, replicate))
        label = launch_label(name, replicate)
        if index is None:
            continue
        if index.status == "skipped":
            problems.append(f"{label}/{launch_phase} skipped ({index.reason})")
            continue
        complete += sum(c.status == COMPLETE for c in index.cells)
        pruned += sum(c.status == PRUNED for c in index.cells)
        problems += [f"{label}/{c.key} {c.status} ({c.reason})" for c in index.cells if c.status not in DONE]
    head = f"connector-tax: done; results in {layout.root}: {complete} cells complete"
    if pruned:
        head += f" ({pruned} pruned past a knee)"
    if not problems:
        return head
    shown = "; ".join(problems[:5]) + (f"; +{len(problems) - 5} more" if len(problems) > 5 else "")
    return f"{head}, {len(problems)} not complete (listed in MANIFEST.md; a re-run retries them): {shown}"
