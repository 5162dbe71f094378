"""Disjoint CPUs for phase jobs that run side by side on one host.

A phase job pins its load generator, its workers and its server to CPUs of its own (the load
generator's affinity plan). Two such jobs at once (`snakemake --cores 8`, several GPUs) would
plan the same CPUs and preempt each other's sends. So a job that may have neighbours leases
`n` CPUs — one exclusive file lock per CPU in a private per-user directory, released by the
kernel when the job ends, however it ends — and restricts itself to them before it plans or
launches anything; its children inherit the set. A job alone on the host (the job's threads
are all the cores Snakemake may use) leases nothing and keeps every CPU. A job SLURM placed
(serving.slurm) leases nothing either: SLURM bound it to CPUs of its own, its allowed set.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from connector_tax.serving.lifecycle import exclusive_lock, private_dir
from connector_tax.serving.slurm import adopted


@contextlib.contextmanager
def cpu_lease(n: int | None, timeout_s: float = 3600.0) -> Iterator[list[int] | None]:
    """Hold `n` CPUs of this process's allowed set and run on them; None: no lease, all CPUs."""
    allowed = sorted(os.sched_getaffinity(0))
    if not n or n >= len(allowed) or adopted() is not None:
        yield None
        return
    locks = private_dir("cpus")
    deadline = time.monotonic() + timeout_s
    held: dict[int, int] = {}
    try:
        while True:
            for cpu in allowed:
                if cpu not in held and len(held) < n:
                    fd = exclusive_lock(locks / f"cpu{cpu}.lock")
                    if fd is not None:
                        held[cpu] = fd
            if len(held) == n:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(held)} of {n} CPUs free among {allowed} after {timeout_s:.0f} s")
            time.sleep(0.5)
        cpus = sorted(held)
        os.sched_setaffinity(0, cpus)
        try:
            yield cpus
        finally:
            os.sched_setaffinity(0, allowed)
    finally:
        for fd in held.values():
            os.close(fd)
