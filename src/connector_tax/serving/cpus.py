"""Disjoint CPUs for phase jobs that run side by side on one host, near their GPU.

A phase job pins its load generator, its workers and its server to CPUs of its own (the load
generator's affinity plan). Two such jobs at once (`snakemake --cores N`, several GPUs) would
plan the same CPUs and preempt each other's sends. So a job that may have neighbours leases
`n` CPUs — one exclusive file lock per CPU in a private per-user directory, released by the
kernel when the job ends, however it ends — and restricts itself to them before it plans or
launches anything; its children inherit the set. A job with a GPU leases them from its GPU's
NUMA node (serving.topology) as far as that node has CPUs free, so its server's host threads
and the load generator share the GPU's memory controller and PCIe root. A job alone on the host
(the job's threads are all the cores Snakemake may use) leases nothing and keeps every CPU. A
job SLURM placed (serving.slurm) leases nothing either: SLURM bound it to CPUs of its own.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from connector_tax.serving import topology
from connector_tax.serving.lifecycle import exclusive_lock, private_dir
from connector_tax.serving.slurm import adopted


@dataclass(frozen=True)
class Leased:
    cpus: list[int]
    numa_node: int | None  # the node they were leased from (None: from anywhere)
    pinned: bool  # False on a rehearsed host whose CPUs this machine lacks (serving.topology)

    def record(self) -> dict[str, object]:
        return {"cpus": self.cpus, "cpus_numa_node": self.numa_node, "cpus_pinned": self.pinned}


@contextlib.contextmanager
def cpu_lease(n: int | None, near: int | None = None, timeout_s: float = 3600.0) -> Iterator[Leased | None]:
    """Hold `n` CPUs (of NUMA node `near` when it has that many) and run on them; None: no lease."""
    allowed = sorted(os.sched_getaffinity(0))
    universe = topology.leasable_cpus()
    if not n or n >= len(universe) or adopted() is not None:
        yield None
        return
    # The GPU's node first; the rest of the host when the node has too few CPUs free (a node's
    # share of `--cores` smaller than its GPUs' jobs need), rather than waiting for them.
    local = [c for c in topology.node_cpus(near) if c in universe]
    candidates = local + [c for c in universe if c not in local]
    locks = private_dir("cpus")
    deadline = time.monotonic() + timeout_s
    held: dict[int, int] = {}
    try:
        while True:
            for cpu in candidates:
                if cpu not in held and len(held) < n:
                    fd = exclusive_lock(locks / f"cpu{cpu}.lock")
                    if fd is not None:
                        held[cpu] = fd
            if len(held) == n:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(held)} of {n} CPUs free among {candidates} after {timeout_s:.0f} s")
            time.sleep(0.5)
        cpus = sorted(held)
        node = near if local and set(cpus) <= set(local) else None
        pinned = set(cpus) <= set(allowed)
        if pinned:
            os.sched_setaffinity(0, cpus)
        try:
            yield Leased(cpus, node, pinned)
        finally:
            if pinned:
                os.sched_setaffinity(0, allowed)
    finally:
        for fd in held.values():
            os.close(fd)
