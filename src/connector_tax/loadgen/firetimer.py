"""Fire callbacks at exact monotonic times inside an event loop (the worker's send timer).

Requests reach a worker a couple of milliseconds before they are due; waking a sleeping
process costs ~100 µs here (measured for ZMQ and for a plain pipe alike), so the worker does
the last, precise wait itself: a timerfd armed in nanoseconds wakes the loop a short spin
before the target, and the callback spins the rest. Where timerfd is missing (not Linux) the
loop's own timer (1 ms granularity) with a longer spin stands in.
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import itertools
import os
import time
from collections.abc import Callable

from connector_tax.loadgen.timing import wait_until

CLOCK_MONOTONIC = 1
TFD_NONBLOCK = 0o4000
TFD_CLOEXEC = 0o2000000
TFD_TIMER_ABSTIME = 1


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


class FireTimer:
    def __init__(self, loop: asyncio.AbstractEventLoop, spin_ns: int = 200_000) -> None:
        self.loop = loop
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        timer = _timerfd()
        self._fd, self._libc = timer if timer else (-1, None)
        self.spin_ns = spin_ns if timer else 1_500_000
        self._handle: asyncio.TimerHandle | None = None
        if self._fd >= 0:
            loop.add_reader(self._fd, self._on_timer)

    def at(self, t_ns: int, callback: Callable[[], None]) -> None:
        """Run callback at t_ns (never before); now if t_ns is within the spin window."""
        if t_ns - time.monotonic_ns() <= self.spin_ns:
            wait_until(t_ns, spin_ns=self.spin_ns)
            callback()
            return
        heapq.heappush(self._heap, (t_ns, next(self._seq), callback))
        if self._heap[0][0] == t_ns:
            self._arm(t_ns - self.spin_ns)

    def _arm(self, wake_ns: int) -> None:
        if self._fd >= 0:
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
                pass
        while self._heap and self._heap[0][0] - time.monotonic_ns() <= self.spin_ns:
            t_ns, _, callback = heapq.heappop(self._heap)
            wait_until(t_ns, spin_ns=self.spin_ns)  # within the spin window: spins, never sleeps
            callback()
        if self._heap:
            self._arm(self._heap[0][0] - self.spin_ns)

    def cancel_all(self) -> list[Callable[[], None]]:
        pending = [cb for _, _, cb in self._heap]
        self._heap.clear()
        return pending

    def close(self) -> None:
        if self._fd >= 0:
            self.loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

