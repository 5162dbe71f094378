"""What a cell's p90 estimates: the expected sample p90 of an n-request cell, from a long run.

The truth oracle's p90 tax is a ratio of population p90s (truth.py). A study's cell estimates it
with the p90 of its own n requests (numpy's linear interpolation between the order statistics
around (n - 1) * 0.9). That sample p90 is a weighted mean of the population's quantiles over a
band of levels around 0.9 (about 0.83-0.97 at n = 64): where the tax changes across that band,
the cell's p90 tax is centred on the band's tax, not on the tax at exactly 0.9. On a narrow,
lumpy distribution (the simulator's decode steps take a few distinct times) the two differ by more
than a cell's interval is wide, and a correct interval around the cell's number misses the point
value. `expected_sample_quantile` gives the band's value exactly, from the order statistics'
Beta distributions over a long run's sorted values; benchmarks/p90_band.py sets it beside the
tax at each quantile level. The band assumes a cell's requests independent; `windowed_tax` gives
what cells centre on when their requests share load (consecutive windows of the long run).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import beta


def expected_order_statistic(sorted_values: np.ndarray, k: int, n: int) -> float:
    """E[X_(k)] of n draws from the distribution of `sorted_values` (its empirical quantile
    function): X_(k) = Q(U_(k)) with U_(k) ~ Beta(k, n + 1 - k), integrated over each value's
    share of (0, 1)."""
    if not 1 <= k <= n:
        raise ValueError(f"order statistic {k} of {n} draws")
    edges = np.linspace(0.0, 1.0, sorted_values.size + 1)
    weights = np.diff(beta.cdf(edges, k, n + 1 - k))
    return float(weights @ sorted_values)


def expected_sample_quantile(values: np.ndarray, n: int, q: float = 0.9) -> float:
    """The expected value of numpy's (linear) sample q-quantile of n draws from the distribution
    of `values` (a long run's requests: the population)."""
    if n < 2:
        raise ValueError(f"a sample quantile needs 2 or more draws, not {n}")
    x = np.sort(np.asarray(values, dtype=np.float64))
    h = (n - 1) * q
    j = math.floor(h)
    g = h - j
    low = expected_order_statistic(x, j + 1, n)
    return low if g == 0 else (1 - g) * low + g * expected_order_statistic(x, j + 2, n)


def band_tax(variant: np.ndarray, baseline: np.ndarray, n: int, q: float = 0.9) -> float:
    """The tax an n-request cell's p90s centre on: the ratio of the two expected sample p90s, less 1."""
    return expected_sample_quantile(variant, n, q) / expected_sample_quantile(baseline, n, q) - 1.0


def point_tax(variant: np.ndarray, baseline: np.ndarray, q: float = 0.9) -> float:
    """The tax at exactly quantile level q of the two long runs (the truth's estimand)."""
    return float(np.quantile(variant, q) / np.quantile(baseline, q)) - 1.0


def windowed_tax(variant: np.ndarray, baseline: np.ndarray, n: int, q: float = 0.9) -> float:
    """The mean p90 tax over consecutive n-request windows of two long runs of common traffic (both
    in send order, request i of one paired with request i of the other): what a cell of n requests
    in steady state centres on when its requests share load, as one cell's do (the band assumes
    them independent). Whole windows only."""
    if n < 2:
        raise ValueError(f"a sample quantile needs 2 or more draws, not {n}")
    v, b = np.asarray(variant, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if v.size != b.size:
        raise ValueError(f"paired runs of {v.size} and {b.size} requests")
    k = v.size // n
    if k == 0:
        raise ValueError(f"a window of {n} requests in a run of {v.size}")
    per_v = np.percentile(v[: k * n].reshape(k, n), 100 * q, axis=1)
    per_b = np.percentile(b[: k * n].reshape(k, n), 100 * q, axis=1)
    return float(np.mean(per_v / per_b)) - 1.0
