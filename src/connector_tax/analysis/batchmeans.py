"""Confidence intervals for a percentile of a time series of correlated requests: batch means.

Consecutive requests of one cell are not independent: they share the server's queue, so a slow
stretch makes several slow requests in a row, and an interval that assumes independence (the
order-statistic one in quantiles.py) is too narrow. Batch means (here, batched quantiles) cut
the cell's requests, in the order they were sent, into k consecutive batches, take the
percentile of each, and form a Student-t interval from the spread of those batch percentiles,
centred on the percentile of all requests:

    q ± t(0.975, k-1) · sd(q_1..q_k) / sqrt(k)

With batches much longer than the correlation time, the batch percentiles are close to
independent and the interval keeps its coverage (tests/unit/test_analysis_batchmeans.py checks it on
autocorrelated series whose true percentile is known). The batches are long before they are
many: k = n // PREFERRED_BATCH, between MIN_BATCHES and MAX_BATCHES. Twenty batches of 20
requests under-covered the TPOT p90 tax of smooth (gamma-4) arrivals, 65-80 % for a nominal
95 % (the simulator's truth, tests/e2e/test_oracle_truth_coverage.py); five of 80 covered 97-100 %.
Fewer than MIN_BATCHES x MIN_PER_BATCH values give no interval: a missing interval means
"cannot tell", never a number.
"""

from __future__ import annotations

import math

import numpy as np

METHOD = (
    "batch means: the cell's requests in send order cut into consecutive batches, as many of about 80 "
    "as fit, 5 at least and 20 at most (64 requests: 5 of about 13), the percentile of each batch, a "
    "Student-t 95% interval from their spread, centred on "
    "the percentile of all requests (accounts for the autocorrelation of consecutive requests)"
)
PREFERRED_BATCH = 80
MIN_BATCHES, MAX_BATCHES = 5, 20
MIN_PER_BATCH = 10


def batch_count(n: int) -> int:
    """How many batches n values are cut into: as many of PREFERRED_BATCH as fit, 5 to 20."""
    return max(MIN_BATCHES, min(MAX_BATCHES, n // PREFERRED_BATCH))


# Student-t 0.975 quantiles by degrees of freedom (no scipy): exact to 3 decimals.
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    25: 2.060,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
}


def t975(df: int) -> float:
    if df in _T975:
        return _T975[df]
    below = max(k for k in _T975 if k <= df) if df > 1 else 1
    return _T975[below] if df < 120 else 1.960


def percentile_ci(
    values: np.ndarray, p: float, batches: int | None = None
) -> tuple[float | None, float | None, float | None]:
    """(estimate, lower, upper) of the p-th percentile of `values` (in time order); `batches`
    defaults to batch_count(n); the bounds are None with fewer than batches x MIN_PER_BATCH values."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return None, None, None
    estimate = float(np.percentile(arr, p))
    batches = batches or batch_count(arr.size)
    if arr.size < batches * MIN_PER_BATCH:
        return estimate, None, None
    per = np.array([np.percentile(chunk, p) for chunk in np.array_split(arr, batches)])
    half = t975(batches - 1) * float(per.std(ddof=1)) / math.sqrt(batches)
    return estimate, estimate - half, estimate + half


def relative_half_width(values: np.ndarray, p: float) -> float | None:
    """Half the interval's width over the estimate (None without an interval)."""
    est, lo, hi = percentile_ci(values, p)
    if est is None or lo is None or hi is None or est <= 0:
        return None
    return (hi - lo) / 2 / est
