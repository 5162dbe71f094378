"""Waiting for a request's scheduled send time.

A pure busy-wait is precise but burns a whole core even at 1 req/s, and that core is
one the 2-core study machine cannot spare; a pure sleep is cheap but the kernel wakes us tens of
microseconds late (timer slack, scheduler latency). So: sleep until shortly before the target,
then spin the last stretch. The spin window only has to cover the sleep's overshoot.
"""

from __future__ import annotations

import time

# Wider than the usual sleep overshoot on Linux (50 us default timer slack + wake-up latency),
# narrow enough that a 1,000 req/s schedule still spends most of each gap asleep.
DEFAULT_SPIN_NS = 200_000


def wait_until(target_ns: int, spin_ns: int = DEFAULT_SPIN_NS) -> int:
    """Block until time.monotonic_ns() >= target_ns; return the monotonic_ns read at exit.

    Never returns before the target. A target already in the past returns at once, so a late
    scheduler catches up instead of sliding the whole schedule.
    """
    now = time.monotonic_ns()
    # A loop, not a single sleep: a sleep cut short (or a very coarse clock) must not hand the
    # remaining long stretch to the spin.
    while target_ns - now > spin_ns:
        time.sleep((target_ns - now - spin_ns) / 1e9)
        now = time.monotonic_ns()
    while now < target_ns:
        now = time.monotonic_ns()
    return now


_PR_SET_TIMERSLACK = 29
_PR_GET_TIMERSLACK = 30


def set_timer_slack(ns: int = 1_000) -> bool:
    """Lower the calling THREAD's timer slack (Linux prctl); False where unsupported.

    Linux lets a sleep end up to the timer slack (50 us by default) late so it can batch wake-ups;
    that slack is most of a sleep's overshoot, so lowering it in the session thread halves the
    median overshoot the spin has to absorb (measured ~88 -> ~40 us on the 2-core study VM). Call it
    from the thread that runs wait_until(): the setting is per thread and new threads inherit it.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0) != 0:
            return False
        return int(libc.prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)) == ns
    except (OSError, AttributeError, TypeError, ValueError):
        return False
