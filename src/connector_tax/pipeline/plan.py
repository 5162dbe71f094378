"""What one launch of a configuration must measure: its cells, each with its fingerprint.

The same plan is computed by the Snakefile (to tell Snakemake, and the user in a dry run, what
changed) and by the phase job (to decide which cells to reuse), so both always agree.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connector_tax.config import PHASE_A, PHASE_B, Cell, StudyConfig, Variant, launch_label, planned_cells
from connector_tax.contract import StudyLayout
from connector_tax.contract.fingerprint import (
    cell_settings,
    code_versions,
    differences,
    fingerprint,
    launch_settings,
    normalize_argv,
    sha,
    short,
)
from connector_tax.contract.index import COMPLETE, DONE, PRUNED, PhaseIndex, read_index, verify_cell
from connector_tax.launch.command import launch_spec
from connector_tax.pipeline.gate import stands_perturbed
from connector_tax.pipeline.provenance import server_versions

# Any valid port: the launch argv is planned with it and it is normalized away.
_PLAN_PORT = 8000


@dataclass(frozen=True)
class CellPlan:
    cell: Cell
    settings: dict[str, Any]
    fingerprint: str


@dataclass
class LaunchPlan:
    name: str
    launch_phase: str
    launch: dict[str, Any]
    code: dict[str, Any]
    cells: list[CellPlan]
    replicate: int = 1

    @property
    def digest(self) -> str:
        """One line naming every planned cell and its fingerprint (Snakemake's params)."""
        return " ".join(f"{c.cell.key}={short(c.fingerprint)}" for c in self.cells)


def launch_argv(config_path: str | Path, study: StudyConfig, variant: Variant, port: int) -> list[str]:
    """The launch argv as the fingerprint sees it: port and run-specific paths as placeholders."""
    spec = launch_spec(config_path, study, variant, port)
    return normalize_argv(spec.argv, port, {"<study_config>": str(config_path), "<python>": sys.executable})


def read_reference(layout: StudyLayout) -> dict[str, Any] | None:
    try:
        reference: dict[str, Any] = json.loads(layout.reference_rates.read_text(encoding="utf-8"))
        return reference
    except (OSError, ValueError):
        return None


def launch_plan(
    config_path: str | Path,
    study: StudyConfig,
    name: str,
    launch_phase: str,
    reference: dict[str, Any] | None,
    replicate: int = 1,
) -> LaunchPlan:
    variant = study.variant(name)
    argv = launch_argv(config_path, study, variant, _PLAN_PORT)
    # The fingerprint hashes the config as written (contract/fingerprint.py): the raw sections.
    launch = launch_settings(study.raw, variant.raw, argv, server_versions(study))
    code = code_versions(study.backend)
    cells = []
    for cell in planned_cells(study, name, launch_phase, reference, replicate):
        settings = cell_settings(study.raw, cell)
        cells.append(CellPlan(cell, settings, fingerprint(launch, settings, code)))
    return LaunchPlan(name, launch_phase, launch, code, cells, replicate)


def pending_cells(layout: StudyLayout, plan: LaunchPlan) -> dict[str, str]:
    """{cell key: why it must be measured} for the planned cells that cannot be reused."""
    out = {}
    index = read_index(layout.index(plan.name, plan.launch_phase, plan.replicate))
    for planned in plan.cells:
        files = layout.phase(plan.name, planned.cell.phase, plan.replicate).cell(planned.cell.label)
        ok, why = verify_cell(files, planned.fingerprint)
        if ok and (perturbed := stands_perturbed(files)):
            ok, why = False, perturbed
        if ok:
            continue
        old = index.cell(planned.cell.phase, planned.cell.label) if index else None
        if index is not None and old is not None and old.fingerprint != planned.fingerprint:
            changed = differences(
                {"launch": index.launch, "cell": old.settings, "code": index.code},
                {"launch": plan.launch, "cell": planned.settings, "code": plan.code},
            )
            why = "settings changed: " + "; ".join(changed) if changed else why
        out[planned.cell.key] = why
    return out


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


def job_threads(study: StudyConfig) -> int:
    """CPUs a phase job keeps busy: the load generator's main process and workers, and the
    server (one core for the simulator, four for vLLM's API server, engine core and worker on
    a GPU host; on a CPU host vLLM computes on every core it may use). A study in virtual time
    launches neither: its job computes each cell in its own process, on one core, so jobs run
    side by side as cores allow (`ctax plan --predict`)."""
    if study.virtual_clock:
        return 1
    loadgen = 1 + study.loadgen.workers
    if study.backend != "vllm":
        return loadgen + 1
    return (os.cpu_count() or 1) if study.device == "cpu" else loadgen + 4


def launch_digest(study: StudyConfig, config_path: str | Path, name: str) -> str:
    """The launch settings of a configuration, hashed: what a preflight verdict was checked with."""
    variant = study.variant(name)
    argv = launch_argv(config_path, study, variant, _PLAN_PORT)
    return digest_of(launch_settings(study.raw, variant.raw, argv, server_versions(study)))


def digest_of(launch: dict[str, Any]) -> str:
    """Launch settings (a LaunchPlan's `launch`) as launch_digest names them."""
    return short(sha(launch))
