"""A job that SLURM placed: its GPUs, CPUs and identity come from SLURM's allocation.

Under Snakemake's SLURM executor each phase job is a SLURM job of its own (`--placement slurm`,
set by the rules when a remote-mode snakemake runs them inside an allocation). SLURM has already
given it its GPUs (CUDA_VISIBLE_DEVICES and SLURM_STEP_GPUS of its step) and bound it to its CPUs
(the process's allowed CPU set, by task/affinity or task/cgroup), so the job uses those instead
of leasing from the host (serving.gpus, serving.cpus): a node-wide file lock would be wrong there
— with SLURM's device cgroup every job on a node sees its GPU as device 0 — and the CPUs are
already the job's own. How the job was placed is recorded in its run.json (`placement`), never in
a fingerprint: the same settings measured under SLURM or on a host give the same cells.

A run whose snakemake was killed (-9, a lost login session) leaves its SLURM jobs in the queue,
running or pending: no process of theirs can see it go, since it may have run on another machine.
The next run of the study, holding the study lock, cancels them (`cancel_orphans`) before it
submits its own, so a study always has one writer. It finds them through the phase indexes: the
jobs they name as still running, and every job of the runs that placed a launch — the executor
plugin names each job after its snakemake run, one name per run, so `squeue --name` lists a
killed run's pending jobs too, which no index names yet. (Snakemake's own incomplete markers
would name every submitted job, but the job's own snakemake, in the same folder, rewrites them
without the job id.)
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
    job_name: str | None  # under Snakemake's executor: its run's id, shared by all the run's jobs
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


def _job_name(job_id: str) -> str | None:
    """The job's name as SLURM knows it, or None. Not SLURM_JOB_NAME: inside a step srun sets it
    to the step's program (`python3`), a name other jobs share, which must never select jobs to
    cancel."""
    try:
        queued = _squeue("--jobs", [job_id]).get(job_id)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return queued.name if queued else None


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
        job_name=_job_name(job_id),
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


@dataclass(frozen=True)
class Queued:
    """A job as squeue lists it."""

    state: str  # PENDING, RUNNING, COMPLETING, ...
    name: str  # under Snakemake's executor: its run's id
    workdir: str  # where the submitting snakemake ran
    comment: str  # the executor plugin's `rule_NAME` or `rule_NAME_wildcards_VALUES`


def _squeue(option: str, values: list[str]) -> dict[str, Queued]:
    """This user's jobs that SLURM still lists (pending, running, completing) among those
    `squeue OPTION values` selects (--jobs ids, --name names), by job id."""
    if not values or shutil.which("squeue") is None:
        return {}
    argv = ["squeue", "-h", "-u", str(os.getuid()), "-o", "%i|%T|%j|%Z|%k", option, ",".join(values)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    listed = {}
    for line in out.stdout.splitlines():
        parts = line.split("|", 4)
        if len(parts) == 5:
            listed[parts[0]] = Queued(*parts[1:])
    return listed


def _rule(comment: str) -> str:
    """The executor plugin's job comment as NAME VALUES."""
    return comment.removeprefix("rule_").replace("_wildcards_", " ")


def orphaned_jobs(indexes: list[Any]) -> dict[str, str]:
    """{SLURM job id: what it measures} for the jobs of earlier runs of this study that SLURM still
    lists (the caller holds the study lock, so their snakemake is gone): those the phase indexes
    name as running, and the pending or running jobs of every run that placed a launch (this
    user's, submitted by a snakemake from this working directory)."""
    jobs, runs = {}, set()
    for index in filter(None, indexes):
        placement = getattr(index, "placement", None) or {}
        if placement.get("scheduler") != "slurm":
            continue
        if placement.get("job_name"):
            runs.add(str(placement["job_name"]))
        if index.status == "running" and placement.get("job_id"):
            jobs[str(placement["job_id"])] = f"{index.variant}/{index.phase}"
    listed = {job: jobs[job] for job in _squeue("--jobs", list(jobs))}
    here = os.path.realpath(os.getcwd())  # where snakemake runs, and submitted its jobs from
    for job, queued in _squeue("--name", sorted(runs)).items():
        if os.path.realpath(queued.workdir) == here and queued.comment.startswith("rule_"):
            listed.setdefault(job, f"{_rule(queued.comment)}, {queued.state.lower()}")
    return listed


def cancel_orphans(indexes: list[Any], timeout_s: float = 120.0) -> list[str]:
    """scancel the orphaned jobs and wait until SLURM no longer lists them (each unwinds as on
    a stop signal: its server stopped, its unfinished cell left for this run). Lines saying what
    was done."""
    orphans = orphaned_jobs(indexes)
    if not orphans:
        return []
    subprocess.run(["scancel", *orphans], capture_output=True, text=True, timeout=60)
    deadline = time.monotonic() + timeout_s
    while _squeue("--jobs", list(orphans)) and time.monotonic() < deadline:
        time.sleep(1.0)
    left = _squeue("--jobs", list(orphans))
    lines = [
        f"cancelled SLURM job {job} ({what}) of an earlier run of this study whose snakemake is gone"
        for job, what in orphans.items()
    ]
    if left:
        lines.append(f"SLURM still lists {', '.join(left)} after {timeout_s:.0f} s; their phases may be refused")
    return lines
