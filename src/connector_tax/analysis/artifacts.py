"""The study-level checks behind success criteria 6 and 7: are the artifacts there, and how
long did the phases take."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from connector_tax.config import PHASE_B_PRIME, PHASES


def check_artifacts(study: Any) -> dict[str, Any]:
    """SC6: per launch: its run.json index and env.txt; every planned cell complete (its sealed
    summary vouches for requests, metrics and engine-step files); every non-ok preflight entry and
    every cell not analysed has a reason."""
    missing: list[str] = []
    checked = 0
    for name in study.variants:
        pf = study.preflight.get(name)
        if pf is None and study.preflight:
            missing.append(f"{name}: not in preflight_status.json")
        elif pf is not None and pf.get("status") != "ok" and not pf.get("reason"):
            missing.append(f"{name}: preflight {pf.get('status')} without a reason")
        if pf is not None and pf.get("status") != "ok":
            continue
        for phase in PHASES:
            for run in study.runs_of(name, phase):
                if run.run is None and not run.problems:
                    continue
                where = f"{name}/{run.folder.name}"
                if run.status == "skipped":
                    if not run.reason:
                        missing.append(f"{where}: skipped without a reason")
                    continue
                if run.run is None:
                    missing.append(f"{where}: run.json")
                elif phase != PHASE_B_PRIME and not (run.folder / "env.txt").is_file():
                    missing.append(f"{where}: env.txt")
                checked += len(run.cells) + len(run.problems)
                missing += [f"{where}/{label}: {why}" for label, why in run.problems.items()]
    return {
        "ok": not missing,
        "missing": missing,
        "cells_checked": checked,
        "file_types": [
            "run.json",
            "env.txt",
            "requests_*.jsonl",
            "summary_*.json",
            "metrics_*.jsonl",
            "engine_step_*.jsonl",
        ],
    }


def runtime_of(study: Any) -> dict[str, Any]:
    starts: list[_dt.datetime] = []
    ends: list[_dt.datetime] = []
    for run in study.runs.values():
        r = run.run or {}
        for key, bucket in (("started", starts), ("finished", ends)):
            try:
                if r.get(key):
                    bucket.append(_dt.datetime.fromisoformat(str(r[key]).replace("Z", "+00:00")))
            except ValueError:
                pass
    if not starts or not ends:
        return {"wall_hours": None}
    span = (max(ends) - min(starts)).total_seconds()
    out = {
        "wall_hours": span / 3600.0,
        "first_start": min(starts).isoformat(),
        "last_finish": max(ends).isoformat(),
        "scope": "phase runs (run.json started/finished); preflight and analysis not included",
    }
    cells = [c.summary for run in study.runs.values() for c in run.cells if c.summary]
    if cells and all(s.clock == "virtual" for s in cells):
        # The study took seconds here; what it models is its cells' time on the modelled hardware.
        out["simulated_cell_hours"] = sum(s.wall_s or 0.0 for s in cells) / 3600.0
    return out
