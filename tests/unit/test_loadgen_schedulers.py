"""Arrival processes and the closed-loop gate: statistics, reproducibility, back-pressure."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest

from connector_tax.loadgen.schedule.schedulers import (
    ConcurrencyGate,
    arrivals,
    fixed,
    gamma,
    max_throughput,
    poisson,
)


def take(it, n: int) -> np.ndarray:
    return np.array(list(itertools.islice(it, n)), dtype=np.int64)


def test_poisson_mean_and_dispersion() -> None:
    rate = 50.0
    t = take(poisson(rate, seed=7), 20_000)
    gaps = np.diff(np.concatenate(([0], t))) / 1e9
    mean = gaps.mean()
    assert abs(mean - 1 / rate) / (1 / rate) < 0.03
    # Exponential gaps: variance / mean^2 == 1.
    assert abs(gaps.var() / mean**2 - 1) < 0.05
    # Counts in 1 s windows are Poisson: index of dispersion ~ 1 (400 windows -> SE ~ 0.07).
    counts = np.bincount((t // 1_000_000_000).astype(int))[:-1]
    assert abs(counts.mean() - rate) / rate < 0.03
    assert 0.75 < counts.var() / counts.mean() < 1.25


@pytest.mark.parametrize("shape", [0.5, 1.0, 4.0])
def test_gamma_mean_and_cv2(shape: float) -> None:
    rate = 20.0
    t = take(gamma(rate, shape, seed=3), 20_000)
    gaps = np.diff(np.concatenate(([0], t))) / 1e9
    assert abs(gaps.mean() - 1 / rate) / (1 / rate) < 0.03
    cv2 = gaps.var() / gaps.mean() ** 2
    assert abs(cv2 - 1 / shape) / (1 / shape) < 0.08


def test_gamma_shape_one_is_exponential_in_distribution() -> None:
    g = np.diff(take(gamma(10.0, 1.0, seed=1), 20_000)) / 1e9
    # P(gap > mean) = e^-1 for an exponential.
    assert abs((g > 0.1).mean() - np.exp(-1)) < 0.015


def test_fixed_exact_spacing() -> None:
    t = take(fixed(100.0), 1000)
    assert t[0] == 0
    assert set(np.diff(t).tolist()) == {10_000_000}
    # A period that is not a whole ns never drifts: offset i is round(i * period).
    t3 = take(fixed(3.0), 30_001)
    assert t3[-1] == 10_000_000_000_000  # 30,000 periods of 1/3 s
    assert set(np.diff(t3).tolist()) <= {333_333_333, 333_333_334}


def test_max_throughput() -> None:
    assert list(max_throughput(5)) == [0] * 5
    assert list(arrivals("max", None, seed=0, n=3)) == [0, 0, 0]
    assert list(max_throughput(0)) == []


@pytest.mark.parametrize("kind", ["poisson", "gamma"])
def test_seeded_reproducible(kind: str) -> None:
    a = take(arrivals(kind, 10.0, seed=42, shape=2.0), 5000)
    b = take(arrivals(kind, 10.0, seed=42, shape=2.0), 5000)
    c = take(arrivals(kind, 10.0, seed=43, shape=2.0), 5000)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("kind", ["poisson", "gamma", "fixed"])
def test_monotonic_ints(kind: str) -> None:
    # Crosses several 4,096 blocks, so the carry between blocks is exercised.
    t = list(itertools.islice(arrivals(kind, 1000.0, seed=5, shape=0.3), 10_000))
    assert all(type(x) is int for x in t[:10])
    assert all(b >= a for a, b in zip(t, t[1:]))
    assert t[0] >= 0


def test_arrivals_n_truncates() -> None:
    assert len(list(arrivals("poisson", 5.0, seed=1, n=7))) == 7
    assert list(arrivals("fixed", 2.0, seed=1, n=3)) == [0, 500_000_000, 1_000_000_000]


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"kind": "poisson", "rate": 0}, "rate"),
        ({"kind": "fixed", "rate": -1.0}, "rate"),
        ({"kind": "gamma", "rate": None}, "rate"),
        ({"kind": "poisson", "rate": float("nan")}, "rate"),
        ({"kind": "gamma", "rate": 1.0, "shape": 0}, "shape"),
        ({"kind": "max", "rate": None}, "n"),
        ({"kind": "max", "rate": None, "n": -1}, "n"),
        ({"kind": "burst", "rate": 1.0}, "kind"),
    ],
)
def test_arrivals_errors(kwargs: dict, word: str) -> None:
    # Raised at the call, not at the first next(): the CLI validates before the cell starts.
    with pytest.raises(ValueError) as exc:
        arrivals(seed=0, **kwargs)
    msg = str(exc.value)
    assert msg.startswith(word + ":")
    assert "\n" not in msg


def test_gate_no_ramp_never_exceeds_target() -> None:
    gate = ConcurrencyGate(3)
    gate.start(time.monotonic_ns())
    lock = threading.Lock()
    peak = 0
    done = 0

    def worker() -> None:
        nonlocal peak, done
        for _ in range(300):
            assert gate.acquire(timeout_s=60)  # a bail-out: eight threads share a loaded host
            with lock:
                peak = max(peak, gate.in_flight)
            time.sleep(0)
            gate.release()
        with lock:
            done += 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert done == 8
    assert 1 <= peak <= 3
    assert gate.in_flight == 0


def test_gate_ramp_is_linear() -> None:
    """No releases: the k-th slot opens when ceil(8 * t / 1 s) reaches k, i.e. at (k-1)/8 s:
    never before, and later by no more than 60 ms past how late a plain sleep to the same times,
    in a thread beside it, wakes on this host now."""
    gate = ConcurrencyGate(8, rampup_s=1.0)
    dues = [(k - 1) / 8 for k in range(1, 9)]
    slept: list[float] = []  # the reference: each sleep's lateness, s
    t0 = time.monotonic_ns()

    def sleeper() -> None:
        for due in dues:
            time.sleep(max(0.0, due - (time.monotonic_ns() - t0) / 1e9))
            slept.append((time.monotonic_ns() - t0) / 1e9 - due)

    reference = threading.Thread(target=sleeper)
    gate.start(t0)
    reference.start()
    times = []
    for _ in range(8):
        assert gate.acquire(timeout_s=60)  # a bail-out, not a bound
        times.append((time.monotonic_ns() - t0) / 1e9)
    reference.join(60)
    for k, (t, due) in enumerate(zip(times, dues), 1):
        assert t >= due - 1e-6, f"slot {k} opened early at {t:.4f}s (due {due:.4f}s)"
        assert t < due + max(slept) + 0.06, f"slot {k} opened late at {t:.4f}s (due {due:.4f}s; sleeps {slept})"
    # Ramp over: the cap is the target; a ninth acquire must wait for a release.
    assert gate.current_target(time.monotonic_ns()) == 8
    assert not gate.acquire(timeout_s=0.05)


def test_gate_current_target() -> None:
    gate = ConcurrencyGate(10, rampup_s=2.0)
    assert gate.current_target(123) == 1  # not started
    gate.start(0)
    assert gate.current_target(0) == 1
    assert gate.current_target(-5) == 1
    assert gate.current_target(200_000_000) == 1  # 10 * 0.1 = 1
    assert gate.current_target(200_000_001) == 2
    assert gate.current_target(1_000_000_000) == 5
    assert gate.current_target(1_999_999_999) == 10
    assert gate.current_target(5_000_000_000) == 10
    assert ConcurrencyGate(4).current_target(0) == 4


def test_gate_backpressure_release_wakes() -> None:
    gate = ConcurrencyGate(1)
    assert gate.acquire()
    got = []
    th = threading.Thread(target=lambda: got.append(gate.acquire(timeout_s=5)))
    th.start()
    time.sleep(0.05)
    assert got == []
    gate.release()
    th.join(30)
    assert got == [True]
    assert gate.in_flight == 1


def test_gate_close_unblocks_waiters() -> None:
    gate = ConcurrencyGate(1)
    assert gate.acquire()
    results = []
    threads = [threading.Thread(target=lambda: results.append(gate.acquire())) for _ in range(4)]
    for th in threads:
        th.start()
    time.sleep(0.05)
    gate.close()
    for th in threads:
        th.join(30)
        assert not th.is_alive()
    assert results == [False] * 4
    assert not gate.acquire()
    gate.release()  # a completion arriving after close() is still accounted
    assert gate.in_flight == 0


def test_gate_timeout_and_errors() -> None:
    gate = ConcurrencyGate(1)
    assert gate.acquire(timeout_s=0)
    t = time.monotonic()
    assert not gate.acquire(timeout_s=0.05)
    assert 0.04 < time.monotonic() - t < 5  # the timeout, not a block; how late is the host's
    gate.release()
    with pytest.raises(RuntimeError):
        gate.release()
    with pytest.raises(ValueError, match="^target:"):
        ConcurrencyGate(0)
    with pytest.raises(ValueError, match="^rampup_s:"):
        ConcurrencyGate(2, rampup_s=-1)
