"""timing.wait_until: never early, at once for a past target, cheap at low rates.

How precise it is (the 100 µs lateness budget: median < 50 µs, max < 10 ms) is measured by
`ctax benchmark timers`, beside a plain time.sleep: on a shared host a unit test's lateness is
the host's."""

from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace

import pytest

from connector_tax.loadgen.worker import timing
from connector_tax.loadgen.worker.timing import set_timer_slack, wait_until


def test_never_early() -> None:
    for i in range(300):
        # Vary the gap so both the sleep path (> spin window) and the pure-spin path are used.
        target = time.monotonic_ns() + (50_000 if i % 3 == 0 else 400_000 + 10_000 * (i % 7))
        out = wait_until(target)
        assert out >= target
        assert time.monotonic_ns() >= target


def test_past_target_returns_at_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # On a fake clock (1 µs per read): one read of it, no sleep, no spin.
    reads: list[int] = []

    def read() -> int:
        reads.append(10**12 + 1_000 * len(reads))
        return reads[-1]

    monkeypatch.setattr(timing, "time", SimpleNamespace(monotonic_ns=read, sleep=lambda s: pytest.fail(f"slept {s}")))
    assert wait_until(10**12 - 1_000_000) == 10**12
    assert len(reads) == 1


def test_long_wait_sleeps_instead_of_spinning() -> None:
    cpu0 = time.process_time()
    target = time.monotonic_ns() + 200_000_000
    assert wait_until(target) >= target
    used = time.process_time() - cpu0
    # Only the final ~200 us spin (plus wake-ups) should cost CPU, not the 200 ms wait.
    assert used < 0.05, f"{used * 1e3:.1f} ms CPU for a 200 ms wait"


def test_set_timer_slack_is_per_thread() -> None:
    result: list[bool] = []
    # In a throwaway thread, so the test runner's own threads keep their slack.
    th = threading.Thread(target=lambda: result.append(set_timer_slack(1_000)))
    th.start()
    th.join()
    if sys.platform.startswith("linux"):
        assert result == [True]
    else:
        assert result in ([True], [False])
