"""A calibrated profile's provenance: what it was fitted from, where, when, and how long the
study's jobs took (Snakemake's benchmark records, which `ctax plan` reads)."""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from connector_tax import resources
from connector_tax.analysis.jsonl import read_json
from connector_tax.calibrate.study_tables import StudyData
from connector_tax.config import LAUNCH_OF, LAUNCH_PHASES
from connector_tax.contract import StudyLayout


def _git_version() -> str | None:
    try:
        root = resources.root()
        done = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip() or None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def _benchmark_s(path: Path) -> float | None:
    """The wall seconds of a Snakemake `benchmark:` record."""
    try:
        frame = pd.read_csv(path, sep="\t")
        return float(frame["s"].iloc[-1])
    except (OSError, KeyError, IndexError, ValueError, pd.errors.ParserError):
        return None


def _timing(data: StudyData) -> dict[str, Any]:
    """How long the study's jobs took on its host besides their cells, from Snakemake's
    benchmark records (`ctax plan` uses them instead of its generic launch times): a preflight
    that launched, one that ended SKIP, a phase job around its cells (its time less the cells'
    own wall time and the plan's fixed cost per cell), a SKIPped variant's phase job, and the
    rest of `snakemake all` (the study's span, study.json to MANIFEST.md, less those jobs)."""
    from connector_tax.planning.time_estimate import OVERHEADS

    layout = StudyLayout(data.study.root)
    cell_s = OVERHEADS[data.study.backend].cell_s
    status = read_json(layout.preflight_status) or {}
    launched: list[float] = []
    skipped: list[float] = []
    overheads: list[float] = []
    skip_jobs: list[float] = []
    total = 0.0
    skipped_names = {n: v.get("reason") for n, v in status.items() if isinstance(v, dict) and v.get("status") != "ok"}
    for name in data.study.variants:
        s = _benchmark_s(layout.benchmark(f"preflight_{name}"))
        if s is not None:
            total += s
            (skipped if name in skipped_names else launched).append(s)
        for phase in LAUNCH_PHASES:
            s = _benchmark_s(layout.benchmark(f"{phase}_{name}"))
            if s is None:
                continue
            total += s
            if name in skipped_names:
                skip_jobs.append(s)
                continue
            cells = [c for c in data.cells if c.variant == name and LAUNCH_OF[c.phase] == phase]
            walls = sum(c.summary.wall_s or 0.0 for c in cells)
            overheads.append(s - walls - cell_s * len(cells))
    out: dict[str, Any] = {"source": f"study {data.study.name} on {platform.node()}"}
    if launched:
        out["preflight_s"] = round(float(np.median(launched)), 1)
    if skipped:
        out["preflight_skip_s"] = round(float(np.median(skipped)), 1)
    if overheads:
        out["phase_overhead_s"] = round(float(np.median(overheads)), 1)
    if skip_jobs:
        out["phase_skip_s"] = round(float(np.median(skip_jobs)), 1)
    out["skipped"] = sorted(skipped_names)
    try:
        span = layout.manifest_md.stat().st_mtime - layout.stamp.stat().st_mtime
    except (OSError, AttributeError):
        span = None
    if span is not None and span > total:
        out["study_wall_s"] = round(span, 1)
        out["other_s"] = round(span - total, 1)
    return out


def provenance(data: StudyData, baseline: str) -> dict[str, Any]:
    """Where a profile came from: the study, its server, its host and times, this code's version,
    the cells it was fitted on, and how long the study's jobs took (timing)."""
    runs = [r for r in data.runs.values() if r]
    versions: dict[str, Any] = next((r["server_versions"] for r in runs if r.get("server_versions")), {})
    starts = sorted(r["started"] for r in runs if r.get("started"))
    ends = sorted(r["finished"] for r in runs if r.get("finished"))
    return {
        "study": data.study.name,
        "results_dir": str(data.study.root),
        "seed": data.study.settings.seed,
        "phase_a_rates": data.study.phase_a_rates,
        "served_by": next((r.get("served_by") for r in runs if r.get("served_by")), None),
        "server_versions": versions,
        "measured": {"from": starts[0] if starts else None, "to": ends[-1] if ends else None},
        "fitted": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        "host": {"name": platform.node(), "cpus": _cpus(), "machine": platform.machine()},
        "connector_tax": _git_version(),
        "baseline": baseline,
        "timing": _timing(data),
        "cells": [
            {"variant": c.variant, "phase": c.phase, "cell": c.label, "fingerprint": c.fingerprint} for c in data.cells
        ],
    }


def _cpus() -> int | None:
    import os

    return os.cpu_count()
