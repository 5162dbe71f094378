"""Every thread of a CPU server pinned: the model's compute threads on their cores, the rest apart.

vLLM's CPU build binds only the worker's OpenMP compute threads (VLLM_CPU_OMP_THREADS_BIND);
its API server, its engine core, the worker's other threads and the load generator run wherever
the kernel puts them, so on a 2-core host they land on the compute core part of the time, each
launch its own share (decomposed by benchmarks/launch_variance.py). With
`vllm.cpu.service_cpus` set, once the server is ready every thread of its processes that vLLM did
not bind to the compute cores is moved to the service cores, and the phase job (the load
generator, its samplers, and the workers it starts after) runs there too. Threads created later
inherit their creator's cores: the server's from a service thread land on the service cores,
those a compute thread starts (a connector's progress thread started from the model's thread)
stay with the model, as they did before.

Which thread is a compute thread is read from the kernel, not guessed from names: one whose
allowed cores lie within the compute cores (vLLM bound it there). Only /proc and
sched_setaffinity are touched; a thread that ended meanwhile is skipped.

What the server did to its own placement is recorded first (`server_pins`, run.json
`placement.server_pins`), whether or not the study pins anything: once it is ready, before the
study moves a thread, every thread whose CPUs are narrower than those the server was started on,
by process and CPUs, and the thread each connector was built on with its CPUs before and after the
constructor (the instrumentation's `built_on`). On vLLM's CPU build the worker process's threads
are all on the OpenMP cores (its main thread is bound as OpenMP starts, and every thread it starts
inherits that), and vLLM's NIXL worker re-pins the thread that builds it to `rsv_cores_for_kv`
(docs/nixl-progress.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil


def _threads(pid: int) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return out
    for tid in tids:
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        out.append((tid, name))
    return out


def _tree(root_pid: int) -> list[int]:
    """A process and its descendants (psutil.Error when the root is gone)."""
    return [root_pid] + [p.pid for p in psutil.Process(root_pid).children(recursive=True)]


def pin_server_threads(root_pid: int, service: tuple[int, ...], compute: tuple[int, ...]) -> dict[str, Any]:
    """Move every thread of the server's process tree that is not bound within `compute` to
    `service`; what was done, for run.json (`placement.server_threads`)."""
    try:
        pids = _tree(root_pid)
    except psutil.Error as exc:
        return {"error": f"server process {root_pid}: {exc}"}
    compute_set = set(compute)
    found: list[tuple[int, str, bool]] = []
    for pid in pids:
        for tid, name in _threads(pid):
            try:
                found.append((tid, name, os.sched_getaffinity(tid) <= compute_set))
            except OSError:
                continue  # ended meanwhile
    kept = [f"{name} ({tid})" for tid, name, bound in found if bound]
    if not kept:
        # vLLM bound nothing to the compute cores: moving the rest would put the model on the
        # service cores with everything else. Leave the server as it is, and say so.
        return {"error": f"no thread of the server is bound within {list(compute)}: nothing pinned"}
    moved, failed = 0, []
    for tid, name, bound in found:
        if bound:
            continue
        try:
            os.sched_setaffinity(tid, service)
            moved += 1
        except ProcessLookupError:
            continue
        except OSError as exc:
            failed.append(f"{name} ({tid}): {exc.strerror}")
    return {
        "service_cpus": list(service),
        "compute_cpus": list(compute),
        "moved": moved,
        "compute_threads": kept,
        "failed": failed,
    }


def _cpus(cpus: list[int] | None) -> str:
    return "{" + ",".join(map(str, cpus)) + "}" if cpus is not None else "?"


def server_pins(root_pid: int, launch_cpus: list[int], built: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Every thread of the server's process tree whose CPUs are narrower than `launch_cpus` (those
    the server was started on), grouped by process and CPUs; `built` (launch.steptiming.built_on)
    names the connectors' constructors that moved the thread they ran on. For run.json
    (`placement.server_pins`); `summary` says it in lines for the report."""
    try:
        pids = _tree(root_pid)
    except psutil.Error as exc:
        return {"error": f"server process {root_pid}: {exc}"}
    launch = sorted(launch_cpus)
    groups: dict[tuple[int, tuple[int, ...]], dict[str, Any]] = {}
    for pid in pids:
        names = dict(_threads(pid))
        for tid in names:
            try:
                cpus = sorted(os.sched_getaffinity(tid))
            except OSError:
                continue  # ended meanwhile
            if set(launch) <= set(cpus):
                continue
            group = groups.setdefault(
                (pid, tuple(cpus)),
                {"pid": pid, "process": names.get(pid, "?"), "cpus": cpus, "main": False, "tids": []},
            )
            group["tids"].append(tid)
            group["main"] = group["main"] or tid == pid
    pinned = sorted(groups.values(), key=lambda g: (g["pid"], g["cpus"]))
    builds = list(built or [])
    summary = [
        f"{g['process']} (pid {g['pid']}): {len(g['tids'])} thread(s) on {_cpus(g['cpus'])}"
        + (", its main thread among them" if g["main"] else "")
        for g in pinned
    ]
    for b in builds:
        moved = b.get("cpus_before") != b.get("cpus_after")
        summary.append(
            f"{b['connector']} built on thread {b['tid']} (pid {b.get('pid')}): "
            f"{_cpus(b.get('cpus_before'))} → {_cpus(b.get('cpus_after'))}"
            + (" (the constructor pinned it)" if moved else " (unchanged)")
        )
    return {"launch_cpus": launch, "pinned": pinned, "built_on": builds, "summary": summary}


def pin_sidecar(root_pid: int, service: tuple[int, ...]) -> int:
    """Every thread of a sidecar's process tree (an LMCache server: no model compute of its own)
    onto the service cores; how many were moved."""
    try:
        pids = _tree(root_pid)
    except psutil.Error:
        return 0
    moved = 0
    for pid in pids:
        for tid, _ in _threads(pid):
            try:
                os.sched_setaffinity(tid, service)
                moved += 1
            except OSError:
                continue
    return moved


def pin_this_process(cpus: tuple[int, ...]) -> tuple[int, ...]:
    """Every thread of the calling process onto `cpus` (processes it starts later inherit them);
    returns what the calling thread could use before, to give back."""
    before = tuple(sorted(os.sched_getaffinity(0)))
    for tid, _ in _threads(os.getpid()):
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            continue
    return before
