"""Which planned cells a launch may reuse, and moving everything else out of the way first.

A planned cell is reused only when `verify_cell` says its sealed files belong to exactly the
planned fingerprint, and it does not stand perturbed (gate.stands_perturbed: a busy host spoilt
every attempt; the next run measures it again). Whatever else is on disk under that label (another fingerprint, a failed
or half-sealed cell, an interrupted staging folder) is moved to superseded/ before the cell is
measured again, so no file of one measurement is ever overwritten by, or mixed with, another.
"""

from __future__ import annotations

from typing import Any

from connector_tax.contract import StudyLayout
from connector_tax.contract.fingerprint import short
from connector_tax.contract.index import IndexEntry, move_aside, read_summary, verify_cell
from connector_tax.contract.layout import ATTEMPT_SEP
from connector_tax.measure.cellplan import LaunchPlan
from connector_tax.measure.gate import stands_perturbed


def _why_tag(reason: str, old_fp: str | None, new_fp: str) -> str:
    if old_fp and old_fp != new_fp:
        return f"fp-{short(old_fp)}"
    if reason.startswith("stands perturbed"):
        return "perturbed"
    return "failed" if reason.startswith("failed") else "incomplete"


def clear_staging(layout: StudyLayout, plan: LaunchPlan) -> list[dict[str, Any]]:
    """Move staging folders a killed launch left behind to superseded/ (records kept)."""
    moved = []
    phases = {p.cell.phase for p in plan.cells} | {plan.launch_phase}
    for phase in sorted(phases):
        pl = layout.phase(plan.name, phase, plan.replicate)
        if not pl.staging_root.is_dir():
            continue
        for folder in sorted(p for p in pl.staging_root.iterdir() if p.is_dir()):
            label = folder.name[len(phase) + 1 :] if folder.name.startswith(f"{phase}_") else folder.name
            label = label.split(ATTEMPT_SEP)[0]  # a later attempt at the cell (measure/gate.py)
            files = sorted(p for p in folder.iterdir() if p.is_file())
            dest = pl.superseded(label, "interrupted")
            move_aside(files, dest, {"cell": f"{phase}/{label}", "reason": "interrupted before it was sealed"})
            folder.rmdir()
            moved.append({"cell": f"{phase}/{label}", "reason": "interrupted before it was sealed", "to": str(dest)})
    return moved


def decide(layout: StudyLayout, plan: LaunchPlan) -> tuple[list[IndexEntry], list[dict[str, Any]]]:
    """(index entries of every planned cell, reused ones marked complete; what was moved aside)."""
    entries: list[IndexEntry] = []
    moved = clear_staging(layout, plan)
    for planned in plan.cells:
        cell = planned.cell
        files = layout.phase(plan.name, cell.phase, plan.replicate).cell(cell.label)
        ok, why = verify_cell(files, planned.fingerprint)
        if ok and (perturbed := stands_perturbed(files)):
            ok, why = False, perturbed
        entry = IndexEntry(cell.phase, cell.label, planned.fingerprint, planned.settings)
        if ok:
            summary = read_summary(files)
            entry.status, entry.reused = "complete", True
            entry.counts = {k: v.records for k, v in ((summary.files if summary else None) or {}).items()}
        elif files.existing():
            old = read_summary(files)
            old_fp = old.fingerprint if old is not None else None
            dest = layout.phase(plan.name, cell.phase, plan.replicate).superseded(
                cell.label, _why_tag(why, old_fp, planned.fingerprint)
            )
            why_doc = {
                "cell": cell.key,
                "reason": why,
                "fingerprint": old_fp,
                "replaced_by": planned.fingerprint,
            }
            move_aside(files.existing(), dest, why_doc)
            moved.append({"cell": cell.key, "reason": why, "to": str(dest)})
        entries.append(entry)
    return entries, moved
