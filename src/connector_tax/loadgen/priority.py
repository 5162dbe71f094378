"""Real-time scheduling for the load generator's timing threads (`rt_priority`; best effort, reported).

On a small host the server under test is runnable most of the time, and Linux's fair scheduler
(EEVDF, one autogroup per session) can leave a runnable load generator waiting far longer than
its CPU share suggests. Measured on the 2-core development host against vLLM's CPU build on an
otherwise quiet host: at 2 req/s (64x64) send lateness p99 81-117 ms, max 167 ms, in the fair
class; under SCHED_FIFO priority 10 p99 0.1-3.4 ms; at 8 req/s (256x32) p99 55 ms against 43 µs.
The load generator used ~4 % of a core either way, so a real-time class costs the server little:
it only decides *when* the instrument runs, and then it runs at once.

What is raised: each worker process whole (its event loop and ZMQ's I/O thread, which inherit the
class), the main process's ZMQ I/O thread (the hand-over to the workers) and, while a cell issues
and drains, the session thread. Every other thread, and every process any of them starts, keeps
(or gets back, SCHED_RESET_ON_FORK) the normal class: a server is never started real-time. The
kernel's real-time throttling (95 % of each second by default) still bounds a runaway spin.
Needs root or an RLIMIT_RTPRIO; without it the summary says why, and the validity gate judges
the lateness as it is.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class PriorityState:
    requested: int | None
    applied: bool = False
    why: str | None = None

    def describe(self) -> dict[str, Any]:
        return {"requested": self.requested, "applied": self.applied, "why": self.why}


def set_fifo(priority: int | None, inherit: bool) -> PriorityState:
    """The calling thread to SCHED_FIFO `priority` for good (None: left alone). `inherit`: the
    threads and processes it starts afterwards get the class too; otherwise they start normal."""
    state = PriorityState(priority)
    if priority is None:
        return state
    policy = os.SCHED_FIFO if inherit else os.SCHED_FIFO | os.SCHED_RESET_ON_FORK
    try:
        os.sched_setscheduler(0, policy, os.sched_param(priority))
    except (OSError, AttributeError) as exc:  # PermissionError without root or RLIMIT_RTPRIO
        state.why = f"SCHED_FIFO {priority} not set: {exc}"
        return state
    state.applied = True
    return state


@contextmanager
def raised(priority: int | None, inherit: bool = False) -> Iterator[PriorityState]:
    """The calling thread at SCHED_FIFO `priority` inside the block, its own class restored after."""
    try:
        before = (os.sched_getscheduler(0), os.sched_getparam(0))
    except (OSError, AttributeError) as exc:
        yield PriorityState(priority, why=f"scheduling class not readable: {exc}")
        return
    state = set_fifo(priority, inherit)
    try:
        yield state
    finally:
        if state.applied:
            os.sched_setscheduler(0, *before)
