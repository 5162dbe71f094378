"""Fire callbacks at exact monotonic times inside an event loop (the worker's send timer).

Requests reach a worker milliseconds before they are due; waking a sleeping process costs
~100 µs here at the median and up to ~1 ms at the tail (measured for ZMQ and for a plain pipe
alike, and for a timerfd on an idle virtual CPU), so the worker does the last, precise wait
itself: a timerfd armed in nanoseconds wakes the loop a spin before the target, and the
worker spins the rest.

The spin goes through the loop: each pass hands back to it (call_soon) until the last
BLIND_SPIN_NS, so responses that arrive meanwhile are read, not left until the spin ends (a
blind 1 ms spin put the TTFT-fidelity p99 at ~1 ms when reads were stamped in user space; the
kernel stamps them now, except over TLS). Only the last stretch is a
plain busy-wait, so that no other callback can start right before the send; it is longer than
the worker's usual callbacks (a 64-event read takes ~70 µs), so one that starts before it
still ends in time.

How long to spin is sized by how late this host's wake-ups are, within a CPU budget. The
budget: `spin_share` of the mean time between this worker's requests (a moving average, so a
Poisson schedule's short gaps get the same spin as its long ones), within [min_spin_ns,
spin_ns] — at 100 req/s the full 1 ms (10 % of a core), at 1,000 req/s the 200 µs floor, where
a longer spin would eat the core the worker needs for its responses. Within the budget the
spin is only as long as the wake-ups need: each timer wake-up's lateness (when the loop ran it
minus the time it was armed for: the kernel's wake-up and the loop's own lag alike) is kept for
the last WAKE_MEMORY wake-ups, and the spin is WAKE_MARGIN times the WAKE_QUANTILE_RANK-th
latest of them (~p97: one stalled wake-up does not set it) plus SPIN_PAD_NS, never below
MIN_ADAPTIVE_SPIN_NS. On a quiet host the wake-ups are 20–60 µs late and the spin ~150 µs
instead of 1 ms, which was a fifth of ctax's CPU at 50 req/s (docs/performance.md); on a busy
one they grow late and the spin grows with them, up to the budget, from the next request on.
Until WAKE_MEMORY_MIN wake-ups are seen the budget stands. Where timerfd is missing (not Linux)
the loop's own timer (1 ms granularity) with a 1.5 ms spin stands in, unadapted.
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import itertools
import os
import time
from collections import deque
from collections.abc import Callable

from connector_tax.loadgen.worker.timing import wait_until

CLOCK_MONOTONIC = 1
TFD_NONBLOCK = 0o4000
TFD_CLOEXEC = 0o2000000
TFD_TIMER_ABSTIME = 1
LOOP_TIMER_SPIN_NS = 1_500_000  # without timerfd: the loop's timer is 1 ms coarse


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _timerfd() -> tuple[int, ctypes.CDLL] | None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
    except (OSError, AttributeError):
        return None
    return (fd, libc) if fd >= 0 else None


GAP_WEIGHT = 0.05  # moving average of the gaps: ~20 requests of memory
BLIND_SPIN_NS = 200_000
MIN_BLIND_SPIN_NS = 20_000
RUN_DUE_NS = 20_000  # run_due() (before each read) fires what is due within one read's handling
WAKE_MEMORY = 64  # timer wake-ups whose lateness sizes the spin (~1.3 s at 50 req/s)
WAKE_MEMORY_MIN = 8  # fewer seen: the budget's full spin
WAKE_QUANTILE_RANK = 2  # the 2nd latest of them (the 4th left the heavy load's sends p99 83-164 µs late, not 26)
WAKE_MARGIN = 2  # the spin covers twice that...
SPIN_PAD_NS = 50_000  # ...plus this
MIN_ADAPTIVE_SPIN_NS = 100_000


def spin_window(mean_gap_ns: float, spin_ns: int, spin_share: float, min_spin_ns: int) -> int:
    """How long before its target a request's wait turns from sleeping to spinning."""
    return max(min_spin_ns, min(spin_ns, int(spin_share * mean_gap_ns)))


class FireTimer:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        spin_ns: int = 1_000_000,
        spin_share: float = 0.1,
        min_spin_ns: int = 200_000,
    ) -> None:
        self.loop = loop
        # (target, seq, wake, callback), by target. The heap top's wake is armed; a later entry
        # whose wake is earlier still (a longer spin, a short gap) is reached by the top's spin,
        # which ends before its target: it only spins a little less.
        self._heap: list[tuple[int, int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        timer = _timerfd()
        self._libc: ctypes.CDLL | None
        self._fd, self._libc = timer if timer else (-1, None)
        self.min_spin_ns = min(min_spin_ns, spin_ns) if timer else LOOP_TIMER_SPIN_NS
        self.spin_ns = spin_ns if timer else LOOP_TIMER_SPIN_NS
        self.spin_share = spin_share
        self._last_target: int | None = None
        self._mean_gap_ns: float | None = None
        self._spinning = False  # a pass of _spin is scheduled
        # The blind stretch, sized like the spin: its full 200 µs at low rates, where a busy-wait
        # costs nothing that matters; at 2,000 req/s a 200 µs blind spin per request was 40 %
        # of the worker's core, while run_due() before every read catches a due send anyway.
        self.blind_ns = BLIND_SPIN_NS
        self._handle: asyncio.TimerHandle | None = None
        self._armed_ns = -1  # the wake-up the timerfd is armed for (-1: none)
        self._wake_late: deque[int] = deque(maxlen=WAKE_MEMORY)  # ns late, of the last wake-ups
        if self._fd >= 0:
            loop.add_reader(self._fd, self._on_timer)

    def at(self, t_ns: int, callback: Callable[[], None]) -> None:
        """Run callback at t_ns (never before); start spinning now if t_ns is within its window."""
        if self._last_target is not None and t_ns >= self._last_target:
            gap = t_ns - self._last_target
            mean = self._mean_gap_ns
            self._mean_gap_ns = gap if mean is None else mean + GAP_WEIGHT * (gap - mean)
        self._last_target = t_ns if self._last_target is None else max(t_ns, self._last_target)
        if self._mean_gap_ns is None:
            spin = self.spin_ns
        else:
            spin = spin_window(self._mean_gap_ns, self.spin_ns, self.spin_share, self.min_spin_ns)
            self.blind_ns = spin_window(self._mean_gap_ns, BLIND_SPIN_NS, self.spin_share, MIN_BLIND_SPIN_NS)
        spin = self.spin_for(spin)
        heapq.heappush(self._heap, (t_ns, next(self._seq), t_ns - spin, callback))
        if self._spinning:
            return  # the spin under way reaches it
        if t_ns - spin <= time.monotonic_ns():
            self._spin()
        elif self._heap[0][0] == t_ns:
            self._arm(t_ns - spin)

    def spin_for(self, budget_ns: int) -> int:
        """The spin within `budget_ns`: as long as recent wake-ups were late, with a margin."""
        late = self._wake_late
        if len(late) < WAKE_MEMORY_MIN:
            return budget_ns
        need = WAKE_MARGIN * sorted(late)[-WAKE_QUANTILE_RANK] + SPIN_PAD_NS
        return min(budget_ns, max(MIN_ADAPTIVE_SPIN_NS, need))

    def _arm(self, wake_ns: int) -> None:
        if self._libc is not None:  # a timerfd (else -1 and None: the loop's own timer)
            self._armed_ns = wake_ns
            value = _Itimerspec(_Timespec(0, 0), _Timespec(wake_ns // 1_000_000_000, wake_ns % 1_000_000_000))
            self._libc.timerfd_settime(self._fd, TFD_TIMER_ABSTIME, ctypes.byref(value), None)
        else:
            if self._handle is not None:
                self._handle.cancel()
            delay = max(0.0, (wake_ns - time.monotonic_ns()) / 1e9)
            self._handle = self.loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        if self._fd >= 0:
            try:
                os.read(self._fd, 8)
            except BlockingIOError:
                pass  # not expired after all: no wake-up to measure
            else:
                if self._armed_ns >= 0:
                    self._wake_late.append(max(0, time.monotonic_ns() - self._armed_ns))
                    self._armed_ns = -1
        if not self._spinning:
            self._spin()

    def _spin(self) -> None:
        self._spinning = False
        now = time.monotonic_ns()
        while self._heap and self._heap[0][2] <= now:
            t_ns = self._heap[0][0]
            if t_ns - now > self.blind_ns:
                self._spinning = True
                self.loop.call_soon(self._spin)  # one loop pass: I/O callbacks run, then here again
                return
            self._fire_top()
            now = time.monotonic_ns()
        if self._heap:
            self._arm(self._heap[0][2])

    def run_due(self) -> None:
        """Fire now whatever is due within RUN_DUE_NS. Called before each response read is
        handled: with ~100 streams in flight a single loop pass took 1–3 ms, longer than the
        blind stretch, and the request due behind it left that late; one read takes µs."""
        heap = self._heap
        while heap and heap[0][0] - time.monotonic_ns() <= RUN_DUE_NS:
            self._fire_top()

    def _fire_top(self) -> None:
        """The heap top is due within the blind stretch: spin to its time (never sleeps), fire."""
        t_ns, _, _, callback = heapq.heappop(self._heap)
        wait_until(t_ns, spin_ns=BLIND_SPIN_NS)
        callback()

    def cancel_all(self) -> list[Callable[[], None]]:
        pending = [entry[3] for entry in self._heap]
        self._heap.clear()
        return pending

    def close(self) -> None:
        self._heap.clear()
        if self._fd >= 0:
            self.loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
