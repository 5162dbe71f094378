"""What one launch of a configuration must measure: its cells, each with its fingerprint.

The same plan is computed by the Snakefile (to tell Snakemake, and the user in a dry run, what
changed) and by the phase job (to decide which cells to reuse), so both always agree.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connector_tax.config import Cell, StudyConfig, Variant, planned_cells
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
from connector_tax.contract.index import read_index, verify_cell
from connector_tax.launch.command import launch_spec
from connector_tax.launch.provenance import server_versions
from connector_tax.measure.gate import stands_perturbed

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


def launch_digest(study: StudyConfig, config_path: str | Path, name: str) -> str:
    """The launch settings of a configuration, hashed: what a preflight verdict was checked with."""
    variant = study.variant(name)
    argv = launch_argv(config_path, study, variant, _PLAN_PORT)
    return digest_of(launch_settings(study.raw, variant.raw, argv, server_versions(study)))


def digest_of(launch: dict[str, Any]) -> str:
    """Launch settings (a LaunchPlan's `launch`) as launch_digest names them."""
    return short(sha(launch))
