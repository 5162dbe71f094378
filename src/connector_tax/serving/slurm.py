"""A job that SLURM placed: its GPUs, CPUs and identity come from SLURM's allocation.

Under Snakemake's SLURM executor each phase job is a SLURM job of its own (`--placement slurm`,
set by the rules when a remote-mode snakemake runs them inside an allocation). SLURM has already
given it its GPUs (CUDA_VISIBLE_DEVICES and SLURM_STEP_GPUS of its step) and bound it to its CPUs
(the process's allowed CPU set, by task/affinity or task/cgroup), so the job uses those instead
of leasing from the host (serving.gpus, serving.cpus): a node-wide file lock would be wrong there
— with SLURM's device cgroup every job on a node sees its GPU as device 0 — and the CPUs are
already the job's own. How the job was placed is recorded in its run.json (`placement`), never in
a fingerprint: the same settings measured under SLURM or on a host give the same cells.

A run whose snakemake was killed (-9, a lost login session) leaves its SLURM jobs running: no
process of theirs can see it go, since it may have run on another machine. The next run of the
study, holding the study lock, cancels the jobs its phase indexes name as still running
(`cancel_orphans`) before it submits its own, so a study always has one writer.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any

PLACEMENTS = ("host", "slurm")


@dataclass(frozen=True)
class Allocation:
    job_id: str
    step_id: str | None
    node: str
    partition: str | None
    gpus: tuple[str, ...]  # as the job's processes see them (CUDA_VISIBLE_DEVICES)
    node_gpus: tuple[str, ...]  # SLURM's indexes of those GPUs on the node (SLURM_STEP_GPUS)
    cpus: tuple[int, ...]  # the CPUs SLURM bound the job to

    def record(self) -> dict[str, Any]:
        return {"scheduler": "slurm", **asdict(self)}


def _ids(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def allocation(env: dict[str, str] | None = None) -> Allocation:
    """This process's SLURM allocation; RuntimeError (one line) when it runs outside SLURM."""
    env = dict(os.environ if env is None else env)
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        raise RuntimeError("--placement slurm: not inside a SLURM job (no SLURM_JOB_ID)")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    node_gpus = _ids(env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS"))
    return Allocation(
        job_id=job_id,
        step_id=env.get("SLURM_STEP_ID"),
        node=env.get("SLURMD_NODENAME") or socket.gethostname(),
        partition=env.get("SLURM_JOB_PARTITION"),
        gpus=_ids(visible) if visible is not None else node_gpus,
        node_gpus=node_gpus,
        cpus=tuple(sorted(os.sched_getaffinity(0))),
    )


_adopted: Allocation | None = None


def adopt(placement: str) -> Allocation | None:
    """A job's entry point, once: under `--placement slurm` this process takes its GPUs and CPUs
    from its SLURM allocation from now on (serving.gpus, serving.cpus); `host` leases them."""
    global _adopted
    if placement not in PLACEMENTS:
        raise ValueError(f"--placement: {placement!r} is not one of {', '.join(PLACEMENTS)}")
    _adopted = allocation() if placement == "slurm" else None
    return _adopted


def adopted() -> Allocation | None:
    return _adopted


def placement_record() -> dict[str, Any]:
    """What run.json says about where the job ran."""
    if _adopted is not None:
        return _adopted.record()
    return {"scheduler": "host", "node": socket.gethostname()}


def _squeue_states(job_ids: list[str]) -> dict[str, str]:
    """{job id: state} of those jobs SLURM still lists (pending, running, completing)."""
    if not job_ids or shutil.which("squeue") is None:
        return {}
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i %T", "-j", ",".join(job_ids)], capture_output=True, text=True, timeout=60
    )
    states = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def orphaned_jobs(indexes: list[Any]) -> dict[str, str]:
    """{SLURM job id: what it measures} for phase indexes still `running` under a SLURM job that
    SLURM still lists: jobs of a run whose snakemake is gone (the caller holds the study lock)."""
    jobs = {}
    for index in filter(None, indexes):
        placement = getattr(index, "placement", None) or {}
        if index.status == "running" and placement.get("scheduler") == "slurm" and placement.get("job_id"):
            jobs[str(placement["job_id"])] = f"{index.variant}/{index.phase}"
    if not jobs:
        return {}
    alive = _squeue_states(list(jobs))
    return {job: what for job, what in jobs.items() if job in alive}


def cancel_orphans(indexes: list[Any], timeout_s: float = 120.0) -> list[str]:
    """scancel the orphaned jobs and wait until SLURM no longer lists them (each unwinds as on
    a stop signal: its server stopped, its unfinished cell left for this run). Lines saying what
    was done."""
    orphans = orphaned_jobs(indexes)
    if not orphans:
        return []
    subprocess.run(["scancel", *orphans], capture_output=True, text=True, timeout=60)
    deadline = time.monotonic() + timeout_s
    while _squeue_states(list(orphans)) and time.monotonic() < deadline:
        time.sleep(1.0)
    left = _squeue_states(list(orphans))
    lines = [
        f"cancelled SLURM job {job} ({what}) of an earlier run of this study whose snakemake is gone"
        for job, what in orphans.items()
    ]
    if left:
        lines.append(f"SLURM still lists {', '.join(left)} after {timeout_s:.0f} s; their phases may be refused")
    return lines
