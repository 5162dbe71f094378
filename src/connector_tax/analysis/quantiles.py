"""Percentiles and their distribution-free confidence intervals.

Point estimates use numpy's default (linear interpolation), the same definition as the load
generator's summary. Confidence intervals are ORDER-STATISTIC intervals: for the p-quantile of
n samples, [X_(l), X_(u)] with l, u chosen from the Binomial(n, p) distribution of the number
of samples below the true quantile so that each tail holds at most (1 - conf)/2. The binomial
is evaluated exactly for n <= EXACT_MAX_N (log-space recursion, no scipy needed) and by its
normal approximation above that, where the two agree to well under one order statistic.
When n is too small for a bound (l < 1 or u > n) that bound is None: callers treat a missing
bound as "cannot tell", never as a number.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

CI_METHOD = (
    "order-statistic (distribution-free) 95% confidence interval: [X_(l), X_(u)] with l, u from "
    "the exact Binomial(n, p) distribution (normal approximation for n > 20000); no resampling"
)
EXACT_MAX_N = 20000
_Z = {0.90: 1.6448536269514722, 0.95: 1.959963984540054, 0.99: 2.5758293035489004}
Z95 = _Z[0.95]  # the 95% intervals' z, for the estimates built on them


@lru_cache(maxsize=4096)
def order_stat_ci_ranks(n: int, p: float, conf: float = 0.95) -> tuple[int | None, int | None]:
    """1-based ranks (l, u) of the order statistics bounding the p-quantile at `conf`."""
    if n <= 0:
        return None, None
    alpha = (1.0 - conf) / 2.0
    if n <= EXACT_MAX_N:
        k = np.arange(n + 1, dtype=np.float64)
        # log pmf(k) = log C(n, k) + k log p + (n - k) log(1 - p), by cumulative ratios
        steps = np.log((n - k[:-1]) / (k[:-1] + 1.0)) + math.log(p) - math.log1p(-p)
        logpmf = np.concatenate([[n * math.log1p(-p)], n * math.log1p(-p) + np.cumsum(steps)])
        pmf = np.exp(logpmf - logpmf.max())
        cdf = np.cumsum(pmf) / pmf.sum()  # cdf[j] = P(B <= j)
        # lower: the largest l with P(B <= l - 1) <= alpha
        below = np.nonzero(cdf <= alpha)[0]
        lo = int(below[-1]) + 1 if below.size else 0
        # upper: the smallest u with P(B <= u - 1) >= 1 - alpha
        above = np.nonzero(cdf >= 1.0 - alpha)[0]
        hi = int(above[0]) + 1 if above.size else n + 1
    else:
        z = _Z.get(conf) or _Z[0.95]
        sd = math.sqrt(n * p * (1 - p))
        lo = int(math.floor(n * p - z * sd))
        hi = int(math.ceil(n * p + z * sd)) + 1
    return (lo if lo >= 1 else None), (hi if hi <= n else None)


def _interp_positions(n: int, ps: list[float]) -> list[int]:
    out: set[int] = set()
    for p in ps:
        h = (n - 1) * p / 100.0
        out.add(int(math.floor(h)))
        out.add(int(math.ceil(h)))
    return sorted(out)


def summarize(
    values: np.ndarray, ps: tuple[float, ...] = (50, 90, 99), ci_for: tuple[float, ...] = (90,), conf: float = 0.95
) -> dict[str, float | int | None]:
    """{"n", "pXX" for ps, "pXX_ci_lo"/"pXX_ci_hi" for ci_for}: NaN values are dropped; with
    no value every statistic is None. One np.partition serves every order statistic."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    n = int(arr.size)
    out: dict[str, float | int | None] = {"n": n}
    if n == 0:
        for p in ps:
            out[f"p{p:g}"] = None
        for p in ci_for:
            out[f"p{p:g}_ci_lo"] = out[f"p{p:g}_ci_hi"] = None
        return out
    kth = set(_interp_positions(n, list(ps)))
    ranks = {p: order_stat_ci_ranks(n, p / 100.0, conf) for p in ci_for}
    for lo, hi in ranks.values():
        kth.update(r - 1 for r in (lo, hi) if r is not None)
    part = np.partition(arr, sorted(kth)) if n > 1 else arr
    for p in ps:
        h = (n - 1) * p / 100.0
        f = int(math.floor(h))
        c = int(math.ceil(h))
        out[f"p{p:g}"] = float(part[f] + (part[c] - part[f]) * (h - f))
    for p, (lo, hi) in ranks.items():
        out[f"p{p:g}_ci_lo"] = float(part[lo - 1]) if lo is not None else None
        out[f"p{p:g}_ci_hi"] = float(part[hi - 1]) if hi is not None else None
    return out


CDF_PERCENTILES = np.unique(np.concatenate([np.linspace(0.0, 100.0, 201), [99.9, 99.99]]))


def cdf_grid(values: np.ndarray) -> list[float] | None:
    """The values at CDF_PERCENTILES (enough to draw a CDF without keeping the samples)."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return None
    return [round(float(v), 3) for v in np.percentile(arr, CDF_PERCENTILES)]


# --------------------------------------------------------------------------- interval algebra
# Taxes are functions of two independent quantiles. Each quantile's order-statistic interval is
# turned into a standard error (half-width / z) and combined by the delta method: on the log
# scale for ratios, linearly for differences. This is approximate (~95%) but keeps the
# analysis free of resampling at 10^7 samples; it is stated in every output next to the CIs.
TAX_CI_METHOD = (
    "delta method on each quantile's 95% batch-means interval -> standard error (half-width / 1.96); "
    "ratios combined on the log scale, differences linearly; the two cells are independent measurements"
)


def _se(lo: float | None, hi: float | None, log: bool = False) -> float | None:
    if lo is None or hi is None:
        return None
    if log:
        if lo <= 0 or hi <= 0:
            return None
        return (math.log(hi) - math.log(lo)) / (2 * _Z[0.95])
    return (hi - lo) / (2 * _Z[0.95])


def ratio_minus_one(
    x: float | None, x_lo: float | None, x_hi: float | None, b: float | None, b_lo: float | None, b_hi: float | None
) -> dict[str, Any]:
    """x / b - 1 with a delta-method 95% CI (log scale)."""
    if x is None or b is None or b <= 0 or x <= 0:
        return {"value": None, "ci": None}
    value = x / b - 1.0
    sx, sb = _se(x_lo, x_hi, log=True), _se(b_lo, b_hi, log=True)
    if sx is None or sb is None:
        return {"value": value, "ci": None}
    s = math.hypot(sx, sb)
    r = math.log(x / b)
    return {"value": value, "ci": [math.exp(r - _Z[0.95] * s) - 1.0, math.exp(r + _Z[0.95] * s) - 1.0]}


def difference(
    x: float | None, x_lo: float | None, x_hi: float | None, b: float | None, b_lo: float | None, b_hi: float | None
) -> dict[str, Any]:
    """x - b with a 95% CI from the two intervals' standard errors."""
    if x is None or b is None:
        return {"value": None, "ci": None}
    value = x - b
    sx, sb = _se(x_lo, x_hi), _se(b_lo, b_hi)
    if sx is None or sb is None:
        return {"value": value, "ci": None}
    s = math.hypot(sx, sb)
    return {"value": value, "ci": [value - _Z[0.95] * s, value + _Z[0.95] * s]}


def combine(terms: list[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    """sum(coef * term) of {"value", "ci"} estimates, CI from standard errors in quadrature
    (treats the terms as independent; where they share the baseline this overstates the
    uncertainty, i.e. errs towards "inconclusive")."""
    if any(t.get("value") is None for _, t in terms):
        return {"value": None, "ci": None}
    value = sum(c * t["value"] for c, t in terms)
    if any(t.get("ci") is None for _, t in terms):
        return {"value": value, "ci": None}
    s = math.sqrt(sum((c * (t["ci"][1] - t["ci"][0]) / (2 * _Z[0.95])) ** 2 for c, t in terms))
    return {"value": value, "ci": [value - _Z[0.95] * s, value + _Z[0.95] * s]}


def tax_combination(terms: list[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    """sum(coef * tax) for taxes X_i / P - 1 over ONE shared baseline quantile P, by the
    delta method on the raw quantiles (so P's uncertainty enters once, with its true sign):
    d/dX_i = coef_i / P, d/dP = -sum(coef_i X_i) / P^2. Each term needs "x_p90", "x_ci",
    "base_p90", "base_ci" (as taxes.latency_tax gives); terms over different baselines fall
    back to combine() (independent terms)."""
    if any(t.get("value") is None for _, t in terms):
        return {"value": None, "ci": None}
    value = sum(c * t["value"] for c, t in terms)
    bases = {(t.get("base_p90"), tuple(t.get("base_ci") or ())) for _, t in terms}
    if len(bases) != 1 or any(t.get("method") == "launch" for _, t in terms):
        # Taxes whose intervals include the launch (launch_intervals.py): the cells' own p90
        # intervals do not say that, so each tax's interval enters as it is (independent terms;
        # the shared baseline launch would cancel, so this errs towards "inconclusive").
        return combine(terms)
    p = terms[0][1].get("base_p90")
    sp = _se(*(terms[0][1].get("base_ci") or [None, None]))
    sx = [s for _, t in terms if (s := _se(*(t.get("x_ci") or [None, None]))) is not None]
    if not p or sp is None or len(sx) < len(terms) or any(t.get("x_p90") is None for _, t in terms):
        return {"value": value, "ci": None}
    var = sum((c / p) ** 2 * s**2 for (c, _), s in zip(terms, sx))
    var += (sum(c * t["x_p90"] for c, t in terms) / p**2) ** 2 * sp**2
    s = math.sqrt(var)
    return {"value": value, "ci": [value - _Z[0.95] * s, value + _Z[0.95] * s]}
