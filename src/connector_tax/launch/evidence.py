"""Whether a launch's declared interventions acted, from the evidence they wrote.

Each intervention (patches/interventions) keeps what it did in each process of the launch in
`<folder>/<name>.<pid>.json` (the folder is the launch's, contract.layout.PhaseLayout.evidence,
named to vLLM by $CONNECTOR_TAX_EVIDENCE): installed or not and why, what it wrapped, and how many
calls it intercepted. An intervention is *seen* when it intercepted at least one call in at least
one of the launch's processes: a process may legitimately have nothing to act on (NIXL is
imported only where the worker connector lives), so "installed but idle" in one process is no
failure, while idle in every process is. The phase job refuses a launch in which a declared
intervention is not seen (measure/runners.py), with `unseen(...)` as the reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SEEN = "declared and seen"
NOT_SEEN = "declared, not seen"


def read_evidence(folder: Path | None) -> dict[str, list[dict[str, Any]]]:
    """{intervention: its records, one per process} in `folder` (a half-written or foreign file is skipped)."""
    out: dict[str, list[dict[str, Any]]] = {}
    if folder is None or not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("intervention"), str):
            out.setdefault(doc["intervention"], []).append(doc)
    return out


def _calls(record: Mapping[str, Any]) -> int:
    calls = record.get("calls")
    return calls if isinstance(calls, int) and not isinstance(calls, bool) else 0


def _why_not(records: Sequence[Mapping[str, Any]]) -> str:
    errors = [str(e) for r in records for e in r.get("errors") or []]
    if errors:
        return errors[0]
    if not records:
        return "no process of the launch installed it (no evidence)"
    changed = sorted({str(c) for r in records for c in r.get("changed") or []})
    if not changed:
        waits = sorted({str(m) for r in records for m in r.get("waits_for") or []})
        return f"installed in {len(records)} process(es), none of which imported {' or '.join(waits) or 'its target'}"
    return f"{' and '.join(changed)}, but no call went through it in {len(records)} process(es)"


def verdict(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One intervention's verdict from its records: seen or not, in words, and what it did where."""
    acted = [r for r in records if _calls(r) > 0]
    calls = sum(_calls(r) for r in acted)
    if acted:
        where = ", ".join(f"pid {r.get('pid')} ({r.get('process') or '?'}): {_calls(r)}" for r in acted)
        says = f"{SEEN}: {calls} call(s) intercepted in {len(acted)} of {len(records)} process(es) ({where})"
    else:
        says = f"{NOT_SEEN}: {_why_not(records)}"
    return {
        "seen": bool(acted),
        "says": says,
        "calls": calls,
        "processes": [r.get("pid") for r in records],
        "acted_in": [r.get("pid") for r in acted],
        "changed": sorted({str(c) for r in records for c in r.get("changed") or []}),
        "errors": [str(e) for r in records for e in r.get("errors") or []],
    }


def seen(folder: Path | None, declared: Sequence[str]) -> dict[str, dict[str, Any]]:
    """{declared intervention: its verdict} of the launch whose evidence is in `folder`."""
    found = read_evidence(folder)
    return {name: verdict(found.get(name, [])) for name in declared}


def unseen(verdicts: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why the launch does not measure what its variant declares (one line), or None."""
    missing = [f"{name} {v.get('says')}" for name, v in verdicts.items() if not v.get("seen")]
    if not missing:
        return None
    return "; ".join(missing) + " (the launch ran without what its variant declares: not measured)"
