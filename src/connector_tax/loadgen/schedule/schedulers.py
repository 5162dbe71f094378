"""When each request of a cell is sent: open-loop arrival processes and the closed-loop gate.

An arrival process is an iterator of send times as integer nanoseconds from the cell start
(non-decreasing), so the session thread only adds t0 and waits; it never does arithmetic on
floats in the hot loop, and the schedule is fixed by the seed before any request is sent, which
is what makes the open loop open: nothing the server does can move a send time.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

# Draw inter-arrivals in blocks: one numpy call per 4,096 requests instead of one Python-level
# RNG call per request keeps the scheduler's cost per request well under a microsecond.
_BLOCK = 4096

ARRIVAL_KINDS = ("poisson", "gamma", "fixed", "max")


def _check_rate(rate: object, kind: str) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        raise ValueError(f"rate: arrival {kind!r} needs a positive number, got {rate!r}")
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"rate: arrival {kind!r} needs a positive finite number, got {rate!r}")
    return float(rate)


def _check_shape(shape: object) -> float:
    if isinstance(shape, bool) or not isinstance(shape, (int, float)):
        raise ValueError(f"shape: must be a positive number, got {shape!r}")
    if not math.isfinite(shape) or shape <= 0:
        raise ValueError(f"shape: must be a positive finite number, got {shape!r}")
    return float(shape)


def _check_count(n: object, kind: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n: arrival {kind!r} needs a non-negative integer count, got {n!r}")
    return n


def _cumulative(draw: Callable[[int], np.ndarray]) -> Iterator[int]:
    """Running sum of inter-arrival blocks (seconds) as integer ns offsets."""
    # Accumulate in float ns and round each offset, rather than rounding each gap: rounding
    # gaps would add up to a drift of up to 0.5 ns per request.
    carry = 0.0
    while True:
        gaps_ns = draw(_BLOCK) * 1e9
        offsets = np.cumsum(gaps_ns)
        offsets += carry
        carry = float(offsets[-1])
        yield from np.rint(offsets).astype(np.int64).tolist()


def poisson(rate: float, seed: int) -> Iterator[int]:
    """Poisson arrivals at `rate` per second: exponential gaps with mean 1/rate; infinite."""
    scale = 1.0 / _check_rate(rate, "poisson")
    rng = np.random.default_rng(seed)
    return _cumulative(lambda k: rng.exponential(scale, k))


def gamma(rate: float, shape: float, seed: int) -> Iterator[int]:
    """Gamma-renewal arrivals: gaps ~ Gamma(shape, 1/(rate*shape)), mean 1/rate, CV^2 1/shape.

    shape 1 is Poisson; larger shapes are more regular, smaller ones burstier.
    """
    r = _check_rate(rate, "gamma")
    k = _check_shape(shape)
    rng = np.random.default_rng(seed)
    scale = 1.0 / (r * k)
    return _cumulative(lambda size: rng.gamma(k, scale, size))


def fixed(rate: float) -> Iterator[int]:
    """Exactly 1/rate apart, the first at 0; infinite."""
    period_ns = 1e9 / _check_rate(rate, "fixed")

    def gen() -> Iterator[int]:
        i = 0
        while True:
            # i * period, not a running sum: no drift however long the cell runs.
            yield round(i * period_ns)
            i += 1

    return gen()


def max_throughput(n: int) -> Iterator[int]:
    """n arrivals, all at t=0 (offline / max-throughput mode)."""
    return iter([0] * _check_count(n, "max"))


def _take(it: Iterator[int], n: int) -> Iterator[int]:
    for _ in range(n):
        yield next(it)


def arrivals(
    kind: str,
    rate: float | None,
    seed: int,
    shape: float = 1.0,
    n: int | None = None,
) -> Iterator[int]:
    """Arrival offsets (ns) for a named process; validates eagerly, before any iteration.

    n is required for "max" (how many requests at t=0); for the other kinds it optionally
    truncates the otherwise infinite schedule to the first n arrivals. rate is ignored by "max".
    """
    if kind not in ARRIVAL_KINDS:
        raise ValueError(f"kind: unknown arrival {kind!r}; expected one of {', '.join(ARRIVAL_KINDS)}")
    if kind == "max":
        if n is None:
            raise ValueError("n: arrival 'max' needs the number of requests to send at t=0")
        return max_throughput(n)
    if n is not None:
        _check_count(n, kind)
    checked = _check_rate(rate, kind)  # now, not at the generator's first step
    if kind == "poisson":
        it = poisson(checked, seed)
    elif kind == "gamma":
        it = gamma(checked, shape, seed)
    else:
        it = fixed(checked)
    return it if n is None else _take(it, n)


class ConcurrencyGate:
    """Closed-loop issuance: at most current_target(now) requests in flight.

    The session thread calls acquire() before each send and the completion path calls release();
    a threading.Condition gives back-pressure without polling. During ramp-up the cap
    grows linearly from 1 to target over rampup_s, so a waiter also wakes when the cap
    is due to grow, not only on a release.
    """

    def __init__(self, target: int, rampup_s: float = 0.0) -> None:
        if isinstance(target, bool) or not isinstance(target, int) or target < 1:
            raise ValueError(f"target: concurrency must be an integer >= 1, got {target!r}")
        if (
            isinstance(rampup_s, bool)
            or not isinstance(rampup_s, (int, float))
            or not math.isfinite(rampup_s)
            or rampup_s < 0
        ):
            raise ValueError(f"rampup_s: must be a non-negative number of seconds, got {rampup_s!r}")
        self.target = target
        self.rampup_s = float(rampup_s)
        self._rampup_ns = round(self.rampup_s * 1e9)
        self._cond = threading.Condition()
        self._in_flight = 0
        self._t0_ns: int | None = None
        self._closed = False

    def start(self, t0_ns: int) -> None:
        """Set the ramp-up origin (the cell start, monotonic ns)."""
        with self._cond:
            self._t0_ns = t0_ns
            self._cond.notify_all()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def current_target(self, now_ns: int) -> int:
        if self._rampup_ns <= 0:
            return self.target
        if self._t0_ns is None:
            return 1
        elapsed = now_ns - self._t0_ns
        if elapsed >= self._rampup_ns:
            return self.target
        # Integer arithmetic: ceil(target * elapsed / rampup) exactly, no float edge cases.
        cap = -(-self.target * elapsed // self._rampup_ns)
        return max(1, min(self.target, cap))

    def _ns_until_growth(self, cap: int, now_ns: int) -> int:
        # The cap exceeds `cap` once target * elapsed > cap * rampup.
        assert self._t0_ns is not None
        due = self._t0_ns + cap * self._rampup_ns // self.target + 1
        return max(due - now_ns, 0)

    def acquire(self, timeout_s: float | None = None) -> bool:
        """Take a slot; False on timeout or once closed. Starts the ramp now if start() wasn't called."""
        deadline = None if timeout_s is None else time.monotonic_ns() + round(timeout_s * 1e9)
        with self._cond:
            if self._t0_ns is None:
                self._t0_ns = time.monotonic_ns()
            while True:
                if self._closed:
                    return False
                now = time.monotonic_ns()
                cap = self.current_target(now)
                if self._in_flight < cap:
                    self._in_flight += 1
                    return True
                wait_ns: int | None = None
                if cap < self.target:
                    wait_ns = self._ns_until_growth(cap, now)
                if deadline is not None:
                    left = deadline - now
                    if left <= 0:
                        return False
                    wait_ns = left if wait_ns is None else min(wait_ns, left)
                self._cond.wait(None if wait_ns is None else wait_ns / 1e9)

    def release(self) -> None:
        """Give a slot back (one completed, failed or timed-out request)."""
        with self._cond:
            if self._in_flight <= 0:
                raise RuntimeError("ConcurrencyGate.release() without a matching acquire()")
            self._in_flight -= 1
            # notify_all, not notify: a woken waiter may be one that is about to see close() or
            # its own timeout, and a single notify would then strand the slot.
            self._cond.notify_all()

    def close(self) -> None:
        """Wake every waiter; they and all later acquire() calls return False."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
