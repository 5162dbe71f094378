"""Batch means (analysis/batchmeans.py) keeps a percentile interval's coverage on
autocorrelated series, where an interval that assumes independent samples does not.

AR(1) series x_t = phi x_{t-1} + sqrt(1 - phi^2) e_t with Gaussian e_t are stationary with a
N(0, 1) marginal, so the true p90 is known exactly (1.2816), whatever phi."""

from __future__ import annotations

import numpy as np
import pytest

from connector_tax.analysis.batchmeans import (
    MIN_BATCHES,
    MIN_PER_BATCH,
    batch_count,
    percentile_ci,
    relative_half_width,
)
from connector_tax.analysis.quantiles import order_stat_ci_ranks

TRUE_P90 = 1.2815515655446004
SERIES = 400
N = 2000


def ar1(phi: float, n: int, rng: np.random.Generator) -> np.ndarray:
    e = rng.standard_normal(n) * np.sqrt(1 - phi * phi)
    x = np.empty(n)
    x[0] = rng.standard_normal()
    for t in range(1, n):
        x[t] = phi * x[t - 1] + e[t]
    return x


def iid_percentile_ci(values: np.ndarray, p: float) -> tuple[float, float, float]:
    """The order-statistic interval (quantiles.py), right when the values are independent."""
    v = np.sort(values)
    lo, hi = order_stat_ci_ranks(v.size, p / 100)
    return float(np.percentile(v, p)), float(v[lo - 1]), float(v[hi - 1])


def _coverage(phi: float, method) -> float:
    rng = np.random.default_rng(int(phi * 1000) + 7)
    hits = 0
    for _ in range(SERIES):
        _, lo, hi = method(ar1(phi, N, rng), 90)
        hits += lo <= TRUE_P90 <= hi
    return hits / SERIES


@pytest.mark.parametrize("phi", [0.0, 0.5, 0.8, 0.9])
def test_batch_means_keeps_coverage_on_ar1(phi):
    assert _coverage(phi, percentile_ci) >= 0.90


def test_independent_interval_is_right_on_independent_samples():
    assert _coverage(0.0, iid_percentile_ci) >= 0.92


@pytest.mark.parametrize(("phi", "below"), [(0.5, 0.92), (0.8, 0.75), (0.9, 0.60)])
def test_independent_interval_loses_coverage_on_ar1(phi, below):
    # Seen on these seeds: 0.88 at phi 0.5, 0.62 at 0.8, 0.46 at 0.9 (batch means: >= 0.92).
    assert _coverage(phi, iid_percentile_ci) < below


def test_batches_are_long_before_they_are_many():
    assert [batch_count(n) for n in (50, 400, 799, 800, 1600, 10_000)] == [5, 5, 9, 10, 20, 20]


def test_no_interval_below_the_minimum():
    values = np.arange(MIN_BATCHES * MIN_PER_BATCH - 1, dtype=float)
    est, lo, hi = percentile_ci(values, 90)
    assert est == pytest.approx(np.percentile(values, 90)) and lo is None and hi is None
    assert relative_half_width(values, 90) is None
    assert percentile_ci(np.array([np.nan, np.nan]), 90) == (None, None, None)
