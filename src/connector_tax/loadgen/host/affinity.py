"""CPU affinity plan for the load generator and its workers.

The main process (session thread + event loop) is the bottleneck, so it gets the fastest
physical cores; each worker is I/O-bound and gets one whole physical core (all its hyperthreads)
so no two processes fight over a core and runs repeat. Placement fills the load generator's NUMA
node first and spills to the next-best nodes, keeping IPC memory local where it can.

A duet (servers side by side, each in a CPU set of its own) is planned otherwise (`plan_paired`):
each target's workers run inside that target's set, so each side is its server and the workers
that drive it, alike on both sides, and the main process floats over every CPU.

Topology is a plain value so the plan can be tested for machines we do not have; only
discover_topology() and apply_affinity() touch the real system.
"""

from __future__ import annotations

import os
import re
import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

_SYS_CPU = Path("/sys/devices/system/cpu")
_SYS_NODE = Path("/sys/devices/system/node")


@dataclass(frozen=True)
class CpuInfo:
    cpu: int  # logical CPU number, as sched_setaffinity takes it
    core: int  # physical core key, unique machine-wide; hyperthreads of one core share it
    node: int  # NUMA node
    perf: int = 0  # higher is faster; only the order matters (max freq, CPPC highest_perf, ...)


@dataclass(frozen=True)
class Topology:
    cpus: tuple[CpuInfo, ...]  # the CPUs this process may run on

    @classmethod
    def synthetic(
        cls, cores: int, threads_per_core: int = 1, nodes: int = 1, perf: dict[int, int] | None = None
    ) -> Topology:
        """A regular machine for tests: CPUs numbered as Linux does (thread 0 of every core, then
        the siblings: core c's threads are c, c+cores, ...), cores split evenly over nodes in
        order; perf maps core -> rank (default all equal)."""
        per_node = max(1, cores // nodes)
        out = []
        for t in range(threads_per_core):
            for c in range(cores):
                node = min(c // per_node, nodes - 1)
                out.append(CpuInfo(cpu=t * cores + c, core=c, node=node, perf=(perf or {}).get(c, 0)))
        return cls(tuple(out))


@dataclass(frozen=True)
class AffinityPlan:
    loadgen_cpus: tuple[int, ...]
    worker_cpus: tuple[tuple[int, ...], ...]  # one entry per worker, never empty
    note: str  # how the plan came out; starts with "degraded: " when it is below the ideal
    # Where a server launched next to the load generator should run: every CPU the plan leaves
    # free, else the load generator's own (its session thread only has to be milliseconds
    # early), never a worker's — a server waking on a worker's core preempts its send spin.
    server_cpus: tuple[int, ...] = ()
    # Per worker, where its helper threads (ZMQ's I/O thread) run; empty: the load generator's CPUs.
    helper_cpus: tuple[tuple[int, ...], ...] = ()


def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel CPU list such as "0-3,8,10-11"."""
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"bad CPU list item {part!r} in {text!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        out.extend(range(lo, hi + 1))
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def allowed_cpus() -> list[int]:
    # sched_getaffinity reflects the cgroup cpuset and taskset; os.cpu_count() would not.
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _perf_of(cpus: list[int], sys_cpu: Path) -> dict[int, int]:
    # One source for every CPU, or none: a max frequency and a CPPC perf level do not compare.
    for rel in ("cpufreq/cpuinfo_max_freq", "acpi_cppc/highest_perf", "cpu_capacity"):
        vals = {c: v for c in cpus if (v := _read_int(sys_cpu / f"cpu{c}" / rel)) is not None}
        if len(vals) == len(cpus):
            return vals
    return {c: 0 for c in cpus}


def discover_topology(
    sys_cpu: Path = _SYS_CPU, sys_node: Path = _SYS_NODE, allowed: Iterable[int] | None = None
) -> Topology:
    """The CPUs this process may use, with physical core, NUMA node and performance rank.

    Missing sysfs files (containers, non-Linux) degrade to: each CPU its own core, one node,
    equal performance. The paths and `allowed` (default: this process's affinity mask) are
    parameters only so tests can describe a machine in a fake sysfs.
    """
    cpus = sorted(allowed) if allowed is not None else allowed_cpus()
    core_key: dict[int, int] = {}
    pkg_core_ids: dict[tuple[int, int], int] = {}
    for c in cpus:
        topo = sys_cpu / f"cpu{c}" / "topology"
        siblings = _read(topo / "thread_siblings_list") or _read(topo / "core_cpus_list")
        if siblings:
            try:
                # The lowest sibling number names the core machine-wide, unlike core_id, which
                # repeats across packages.
                core_key[c] = min(parse_cpulist(siblings))
                continue
            except ValueError:
                pass
        core_id = _read_int(topo / "core_id")
        pkg = _read_int(topo / "physical_package_id")
        if core_id is not None:
            core_key[c] = pkg_core_ids.setdefault((pkg or 0, core_id), c)
        else:
            core_key[c] = c
    node_of: dict[int, int] = {}
    try:
        node_dirs = [d for d in sys_node.iterdir() if re.fullmatch(r"node\d+", d.name)]
    except OSError:
        node_dirs = []
    for d in node_dirs:
        text = _read(d / "cpulist")
        if text:
            try:
                for c in parse_cpulist(text):
                    node_of[c] = int(d.name[4:])
            except ValueError:
                pass
    perf = _perf_of(cpus, sys_cpu)
    return Topology(tuple(CpuInfo(cpu=c, core=core_key[c], node=node_of.get(c, 0), perf=perf[c]) for c in cpus))


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


@dataclass
class _Core:
    key: int
    node: int
    perf: int
    cpus: tuple[int, ...]


def _cores(topology: Topology) -> list[_Core]:
    groups: dict[int, list[CpuInfo]] = defaultdict(list)
    for info in topology.cpus:
        groups[info.core].append(info)
    return [
        _Core(
            key=k,
            # A core straddling nodes does not exist on real hardware; take its first CPU's node.
            node=min(v, key=lambda i: i.cpu).node,
            perf=max(i.perf for i in v),
            cpus=tuple(sorted(i.cpu for i in v)),
        )
        for k, v in groups.items()
    ]


def plan_affinity(n_workers: int, loadgen_physical_cores: int = 2, topology: Topology | None = None) -> AffinityPlan:
    """Where the load generator and each worker may run, in three phases: rank the cores, place
    the load generator, then the workers."""
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 0:
        raise ValueError(f"n_workers: must be a non-negative integer, got {n_workers!r}")
    if (
        isinstance(loadgen_physical_cores, bool)
        or not isinstance(loadgen_physical_cores, int)
        or loadgen_physical_cores < 1
    ):
        raise ValueError(f"loadgen_physical_cores: must be an integer >= 1, got {loadgen_physical_cores!r}")
    topology = topology if topology is not None else discover_topology()
    if not topology.cpus:
        raise ValueError("topology: no usable CPUs")

    # Phase 1: cores fast -> slow within each node; nodes ranked by their best core, then by
    # size (more room for workers to stay local), then by number for a stable plan.
    by_node: dict[int, list[_Core]] = defaultdict(list)
    for core in _cores(topology):
        by_node[core.node].append(core)
    for cores in by_node.values():
        cores.sort(key=lambda c: (-c.perf, c.key))
    node_order = sorted(by_node, key=lambda n: (-by_node[n][0].perf, -len(by_node[n]), n))
    total = sum(len(v) for v in by_node.values())
    all_cpus = tuple(sorted(i.cpu for i in topology.cpus))

    if total == 1:
        plan_note = f"degraded: 1 physical core ({_n(len(all_cpus), 'CPU')}); load generator and workers share it"
        return AffinityPlan(all_cpus, tuple(all_cpus for _ in range(n_workers)), plan_note, all_cpus)

    # Phase 2: the load generator on the primary node's fastest cores, leaving at least one
    # core for the workers.
    primary = by_node[node_order[0]]
    n_lg = min(loadgen_physical_cores, len(primary))
    if n_workers > 0:
        n_lg = min(n_lg, total - 1)
    loadgen = primary[:n_lg]

    # Phase 3: the rest of the primary node, then the other nodes in rank order.
    pool = primary[n_lg:] + [c for n in node_order[1:] for c in by_node[n]]
    workers = tuple(pool[i % len(pool)].cpus for i in range(n_workers)) if n_workers else ()

    lg_cpus = tuple(sorted(c for core in loadgen for c in core.cpus))
    taken = set(lg_cpus).union(*(set(w) for w in workers))
    server = tuple(c for c in all_cpus if c not in taken)
    problems = []
    if not server:
        server = lg_cpus if n_workers else all_cpus
        problems.append("a server shares the load generator's cores")
    if n_lg < loadgen_physical_cores:
        problems.append(f"load generator on {n_lg} of the {loadgen_physical_cores} physical cores asked")
    if n_workers > len(pool):
        problems.append(f"{n_workers} workers share {_n(len(pool), 'physical core')}")
    nodes_used = {c.node for c in loadgen} | {pool[i % len(pool)].node for i in range(n_workers)}
    desc = (
        f"{_n(total, 'physical core')} on {_n(len(by_node), 'NUMA node')}; "
        f"load generator on {_n(n_lg, 'core')} of node {node_order[0]}, "
        f"{_n(n_workers, 'worker')}, {_n(len(nodes_used), 'node')} used"
    )
    plan_note = ("degraded: " + "; ".join(problems) + " (" + desc + ")") if problems else desc
    return AffinityPlan(lg_cpus, workers, plan_note, server)


def check_target_cpus(target_cpus: Sequence[Sequence[int]], targets: int, allowed: Iterable[int]) -> None:
    """ValueError naming `target_cpus` unless it holds one non-empty CPU set per target, each of
    CPUs this process may use, no CPU in two sets (a duet's sides must not share a core)."""
    if len(target_cpus) != targets:
        raise ValueError(f"target_cpus: {_n(len(target_cpus), 'CPU set')} for {_n(targets, 'target')} (one per URL)")
    usable = set(allowed)
    owner: dict[int, int] = {}
    for t, cpus in enumerate(target_cpus):
        if not cpus:
            raise ValueError(f"target_cpus: target {t}'s CPU set is empty")
        for cpu in cpus:
            if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu not in usable:
                raise ValueError(
                    f"target_cpus: CPU {cpu!r} of target {t} is not one this process may use ({sorted(usable)})"
                )
            if owner.setdefault(cpu, t) != t:
                raise ValueError(f"target_cpus: CPU {cpu} is in the sets of targets {owner[cpu]} and {t}")


def plan_paired(
    target_cpus: Sequence[Sequence[int]], workers_per_target: int, topology: Topology | None = None
) -> AffinityPlan:
    """A duet's plan: target t's workers (numbered t * workers_per_target + j) on target t's CPU
    set, their helper threads there too, the main process on every CPU it may use (it floats:
    it only hands requests over, 10 ms ahead). No server CPUs: each server runs in its target's set,
    which its launcher chose."""
    topology = topology if topology is not None else discover_topology()
    all_cpus = tuple(sorted(i.cpu for i in topology.cpus))
    check_target_cpus(target_cpus, len(target_cpus), all_cpus)
    if isinstance(workers_per_target, bool) or not isinstance(workers_per_target, int) or workers_per_target < 1:
        raise ValueError(f"workers_per_target: must be an integer >= 1, got {workers_per_target!r}")
    sets = [tuple(sorted(cpus)) for cpus in target_cpus]
    workers = tuple(cpus for cpus in sets for _ in range(workers_per_target))
    note = "paired: " + "; ".join(
        f"target {t}'s {_n(workers_per_target, 'worker')} on CPUs {','.join(map(str, cpus))}"
        for t, cpus in enumerate(sets)
    )
    return AffinityPlan(
        all_cpus, workers, note + f"; the main process floats over {_n(len(all_cpus), 'CPU')}", helper_cpus=workers
    )


def apply_affinity(cpus: tuple[int, ...], pid: int | None = None) -> bool:
    """Pin a process (default: this one), every one of its threads, to cpus; False where pinning
    is unsupported or refused.

    Linux affinity is per thread and only new threads inherit it: pinning just the process id
    left threads started before the call (ZMQ's I/O thread, which carries every request the
    session thread sends) free to run on a worker's core and preempt its send-time spin.
    """
    try:
        process = psutil.Process(pid)
        process.cpu_affinity(list(cpus))
        _pin_threads(process, cpus, skip=process.pid)
    except (AttributeError, NotImplementedError, OSError, ValueError, psutil.Error):
        return False
    return True


def pin_helper_threads(cpus: tuple[int, ...]) -> bool:
    """Pin every thread of this process but the calling one to cpus.

    A worker's ZMQ I/O thread wakes for every message in or out; on the worker's own core it
    preempted the send-time spin (the wake-up lands on the busy core by affinity).
    """
    try:
        _pin_threads(psutil.Process(), cpus, skip=threading.get_native_id())
    except (AttributeError, NotImplementedError, OSError, ValueError, psutil.Error):
        return False
    return True


def _pin_threads(process: psutil.Process, cpus: tuple[int, ...], skip: int) -> None:
    for thread in process.threads():
        if thread.id != skip:
            try:
                os.sched_setaffinity(thread.id, cpus)
            except ProcessLookupError:
                pass  # the thread ended in between
