"""Real-time scheduling for the load generator's timing threads (`rt_priority`; best effort, reported).

On a small host the server under test is runnable most of the time, and Linux's fair scheduler
(EEVDF, one autogroup per session) can leave a runnable load generator waiting far longer than
its CPU share suggests. Measured on the 2-core development host against vLLM's CPU build on an
otherwise quiet host: at 2 req/s (64x64) send lateness p99 81-117 ms, max 167 ms, in the fair
class; under SCHED_FIFO priority 10 p99 0.1-3.4 ms; at 8 req/s (256x32) p99 55 ms against 43 µs.
The load generator used ~4 % of a core either way, so a real-time class costs the server little:
it only decides *when* the instrument runs, and then it runs at once.

What is raised: each worker process whole (its event loop and ZMQ's I/O thread, which inherit the
class), the main process's ZMQ I/O thread (the hand-over to the workers), the sending thread while
a cell issues and drains, and, in a study's phase job, every thread of that process while a cell
runs (`raised_process`): the samplers share the sending thread's GIL, and one preempted while it
held the GIL kept a real-time sending thread waiting 100-500 ms (the CPU study, 2026-11-26). A
server is never started real-time: it is launched before the cells, from a thread in the normal
class, and the other raised threads pass SCHED_RESET_ON_FORK to whatever they start. The kernel's
real-time throttling (95 % of each second by default) still bounds a runaway spin. Needs root or
an RLIMIT_RTPRIO; without it the summary says why, and the validity gate judges the lateness as
it is.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from connector_tax.contract.summary import Priority


@dataclass
class PriorityState:
    requested: int | None
    applied: bool = False
    why: str | None = None

    def describe(self) -> Priority:
        return Priority(self.requested, self.applied, self.why)


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


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [threading.get_native_id()]


@contextmanager
def raised_process(priority: int | None) -> Iterator[PriorityState]:
    """Every thread of this process at SCHED_FIFO `priority` inside the block, each given its own
    class back after; threads the calling thread starts inside inherit it (and are set back too),
    whatever the others start does not. Nothing here may spin: the block's threads sleep between
    their bits of work, and the kernel's real-time throttling bounds a mistake."""
    state = PriorityState(priority)
    if priority is None:
        yield state
        return
    me = threading.get_native_id()
    saved: dict[int, tuple[int, os.sched_param]] = {}
    try:
        for tid in _threads():
            before = (os.sched_getscheduler(tid), os.sched_getparam(tid))
            policy = os.SCHED_FIFO if tid == me else os.SCHED_FIFO | os.SCHED_RESET_ON_FORK
            os.sched_setscheduler(tid, policy, os.sched_param(priority))
            saved[tid] = before
        state.applied = True
    except ProcessLookupError:  # a thread that ended meanwhile: nothing to raise
        state.applied = True
    except (OSError, AttributeError) as exc:
        state.why = f"SCHED_FIFO {priority} not set: {exc}"
    try:
        yield state
    finally:
        for tid in _threads() if saved else ():
            policy, param = saved.get(tid, (os.SCHED_OTHER, os.sched_param(0)))
            try:
                os.sched_setscheduler(tid, policy, param)
            except OSError:
                pass  # ended meanwhile
