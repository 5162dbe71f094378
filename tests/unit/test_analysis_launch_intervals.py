"""Intervals that include the launch and respect what they measure (analysis/launch_intervals.py),
on synthetic data whose truth is known: fast, seeded, no simulator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from connector_tax.analysis.launch_intervals import (
    MIN_P90_SAMPLES,
    ONE_LAUNCH,
    LaunchVariance,
    Series,
    launch_variance,
    log_p90,
    log_percentile_ci,
    paired_log_ratio,
    survives,
    tax_interval,
)


def _ar1(rng: np.random.Generator, n: int, rho: float = 0.6) -> np.ndarray:
    """Autocorrelated log-normal latencies (consecutive requests share the queue)."""
    e = rng.standard_normal(n)
    z = np.empty(n)
    z[0] = e[0]
    for i in range(1, n):
        z[i] = rho * z[i - 1] + math.sqrt(1 - rho**2) * e[i]
    return np.exp(3.0 + 0.8 * z)  # median 20 ms, a heavy right tail


def test_a_p90_interval_is_never_below_zero_and_a_small_cell_says_so():
    rng = np.random.default_rng(1)
    heavy = np.concatenate([rng.exponential(5.0, 60), rng.exponential(400.0, 8)])  # a few slow first tokens
    est, lo, hi = log_percentile_ci(rng.permutation(heavy))
    assert lo is not None and 0 < lo < est < hi
    est, lo, hi = log_percentile_ci(heavy[: MIN_P90_SAMPLES - 1])
    assert est is not None and lo is None and hi is None  # 63 requests: too few to bound a p90


def test_log_p90_intervals_cover_under_autocorrelation():
    rng = np.random.default_rng(2)
    truth = math.exp(3.0 + 0.8 * 1.2815515655446004)
    covered = 0
    for _ in range(300):
        _, lo, hi = log_percentile_ci(_ar1(rng, 400))
        covered += lo <= truth <= hi
    assert 0.88 <= covered / 300 <= 0.995


def test_a_paired_ratio_pairs_requests_by_index_and_cancels_the_traffic():
    rng = np.random.default_rng(3)
    base = _ar1(rng, 500)
    index = rng.permutation(500)  # records come in any order; the index pairs them
    pair = paired_log_ratio(Series(index, base * 1.10), Series(index, base))
    assert pair.paired and pair.n == 500
    assert pair.value == pytest.approx(math.log(1.10)) and pair.variance == pytest.approx(0.0, abs=1e-12)
    other = paired_log_ratio(Series(np.arange(500) + 10_000, _ar1(rng, 500) * 1.1), Series(np.arange(500), base))
    assert not other.paired and other.variance > 0  # no common traffic: two independent cells


def test_one_launch_says_the_launch_variance_is_not_estimated():
    rng = np.random.default_rng(4)
    base = _ar1(rng, 400)
    x = base * np.exp(0.05 + 0.02 * rng.standard_normal(400))
    est = tax_interval(
        [paired_log_ratio(Series(np.arange(400), x), Series(np.arange(400), base))], LaunchVariance(None, 0)
    )
    assert est["note"] == ONE_LAUNCH and est["launch_share"] is None
    assert est["ci"][0] < est["value"] < est["ci"][1]
    big = tax_interval(
        [paired_log_ratio(Series(np.arange(100), x[:100] * 0.02), Series(np.arange(100), base[:100]))],
        LaunchVariance(None, 0),
    )
    assert big["ci"][0] > -1.0  # a ratio's interval never reaches -100 %
    tiny = tax_interval(
        [paired_log_ratio(Series(np.arange(40), x[:40]), Series(np.arange(40), base[:40]))], LaunchVariance(None, 0)
    )
    assert tiny["ci"] is None and "too small" in tiny["note"]


def _launch(s: dict, k: int, variants: int) -> LaunchVariance:
    """The launch variance as the analysis estimates it (the variants x replicates table)."""
    logs = {f"v{v}": {r: log_p90(s[(f"v{v}", r)]) for r in range(k)} for v in range(variants)}
    noise = [paired_log_ratio(s[(f"v{v}", r)], s[("v0", r)]).variance for v in range(1, variants) for r in range(k)]
    return launch_variance(logs, float(np.mean(noise)) / 2)


def _study(rng: np.random.Generator, k: int, sd: float, tax: float, variants: int = 4, n: int = 400):
    """One synthetic study: every variant's k launches of one cell, each launch a log-normal bias,
    every replicate's cells on one traffic; variant 1 has the true tax, the others none."""
    series: dict[tuple[str, int], Series] = {}
    for r in range(k):
        traffic = _ar1(rng, n)
        for v in range(variants):
            bias = math.exp(sd * rng.standard_normal())
            noise = np.exp(0.01 * rng.standard_normal(n))
            series[(f"v{v}", r)] = Series(np.arange(n), traffic * bias * noise * (1 + tax if v == 1 else 1.0))
    return series


@pytest.mark.parametrize("k", [2, 3])
def test_launch_intervals_cover_a_known_tax_where_two_cell_intervals_do_not(k):
    rng = np.random.default_rng(10 + k)
    tax, covered, naive, shares, trials = 0.05, 0, 0, [], 200
    for _ in range(trials):
        s = _study(rng, k, sd=0.05, tax=tax)
        launch = _launch(s, k, 4)
        pairs = [paired_log_ratio(s[("v1", r)], s[("v0", r)]) for r in range(k)]
        est = tax_interval(pairs, launch)
        covered += est["ci"][0] <= tax <= est["ci"][1]
        shares.append(est["launch_share"])
        one = tax_interval(pairs[:1], LaunchVariance(None, 0))  # the first launch alone, launch ignored
        naive += one["ci"][0] <= tax <= one["ci"][1]
    assert covered / trials >= 0.90
    assert naive / trials < 0.6  # an interval that ignores the launch is far too narrow
    assert np.median(shares) > 0.8  # the launch is most of the variance here


def test_launch_variance_recovers_a_known_spread():
    rng = np.random.default_rng(20)
    s = _study(rng, 3, sd=0.08, tax=0.0, variants=60)
    est = _launch(s, 3, 60)
    assert est.df == 59 * 2 and math.sqrt(est.variance) == pytest.approx(0.08, rel=0.2)
    none = launch_variance({"v0": {0: 1.0, 1: 1.1}}, 0.0)  # one variant: nothing to pool
    assert none.variance is None and none.df == 0


def test_a_tax_survives_the_noise_floor_only_beyond_it():
    aa = {"value": 0.0, "ci": [-0.03, 0.04]}
    assert survives({"value": 0.10, "ci": [0.06, 0.14]}, aa) == (True, "beyond the A/A control's noise floor (±4.0%)")
    assert survives({"value": 0.035, "ci": [0.01, 0.06]}, aa)[0] is False
    assert survives({"value": 0.05, "ci": [-0.01, 0.11]}, aa) == (False, "its interval includes 0")
    assert survives({"value": 0.05, "ci": None}, aa)[0] is None
