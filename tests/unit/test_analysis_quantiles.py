"""Percentiles, order-statistic confidence intervals and the tax interval algebra."""

from __future__ import annotations

import numpy as np
import pytest

from connector_tax.analysis.quantiles import (
    cdf_grid,
    combine,
    difference,
    order_stat_ci_ranks,
    ratio_minus_one,
    summarize,
    tax_combination,
)


def test_point_estimates_match_numpy_linear_percentiles():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 200, 1001):
        x = rng.lognormal(0, 1, n)
        s = summarize(x, ps=(50, 90, 99), ci_for=(90,))
        assert s["n"] == n
        for p in (50, 90, 99):
            assert s[f"p{p}"] == pytest.approx(np.percentile(x, p), rel=1e-12)


def test_nan_dropped_and_empty_gives_nones():
    s = summarize(np.array([np.nan, 1.0, 2.0, np.nan]))
    assert s["n"] == 2 and s["p50"] == pytest.approx(1.5)
    e = summarize(np.array([]))
    assert e == {"n": 0, "p50": None, "p90": None, "p99": None, "p90_ci_lo": None, "p90_ci_hi": None}


def test_order_statistic_ranks_known_values():
    # n = 200, p = 0.9: Binomial(200, 0.9) -> ranks around 180 +- 2 sd (4.24)
    lo, hi = order_stat_ci_ranks(200, 0.9)
    assert 170 <= lo <= 174 and 187 <= hi <= 190
    # too few samples for a two-sided 95% interval of p90
    assert order_stat_ci_ranks(10, 0.9)[1] is None
    # exact and normal approximation agree near the switch-over
    lo_e, hi_e = order_stat_ci_ranks(20000, 0.9)
    lo_n, hi_n = order_stat_ci_ranks(20001, 0.9)
    assert abs(lo_e - lo_n) <= 2 and abs(hi_e - hi_n) <= 2


def test_order_statistic_ci_covers_true_quantile_about_95_percent():
    rng = np.random.default_rng(1)
    true_p90 = float(np.exp(1.2815515655446004))  # lognormal(0, 1)
    hits = 0
    trials = 400
    for _ in range(trials):
        s = summarize(rng.lognormal(0, 1, 300), ps=(90,), ci_for=(90,))
        hits += s["p90_ci_lo"] <= true_p90 <= s["p90_ci_hi"]
    assert 0.91 <= hits / trials <= 0.99


def test_ratio_and_difference_intervals():
    r = ratio_minus_one(120.0, 115.0, 125.0, 100.0, 96.0, 104.0)
    assert r["value"] == pytest.approx(0.2)
    assert r["ci"][0] < 0.2 < r["ci"][1]
    assert ratio_minus_one(1.0, None, None, 1.0, 0.9, 1.1)["ci"] is None
    d = difference(10.0, 9.0, 11.0, 4.0, 3.0, 5.0)
    assert d["value"] == 6.0 and d["ci"][0] < 6 < d["ci"][1]
    c = combine([(1.0, {"value": 1.0, "ci": [0.9, 1.1]}), (-1.0, {"value": 0.5, "ci": [0.4, 0.6]})])
    assert c["value"] == pytest.approx(0.5)
    assert c["ci"][1] - c["ci"][0] == pytest.approx(np.hypot(0.2, 0.2), rel=1e-6)


def test_tax_combination_counts_the_shared_baseline_once():
    base = {"base_p90": 100.0, "base_ci": [95.0, 105.0]}
    a = {"value": 0.45, "x_p90": 145.0, "x_ci": [144.0, 146.0], **base}
    b = {"value": 0.38, "x_p90": 138.0, "x_ci": [137.0, 139.0], **base}
    shared = tax_combination([(1.0, a), (-1.0, b)])
    a_ind = {"value": 0.45, "ci": ratio_minus_one(145.0, 144.0, 146.0, 100.0, 95.0, 105.0)["ci"]}
    b_ind = {"value": 0.38, "ci": ratio_minus_one(138.0, 137.0, 139.0, 100.0, 95.0, 105.0)["ci"]}
    indep = combine([(1.0, a_ind), (-1.0, b_ind)])
    assert shared["value"] == pytest.approx(0.07)
    assert shared["ci"][1] - shared["ci"][0] < indep["ci"][1] - indep["ci"][0]


def test_cdf_grid_monotone():
    g = cdf_grid(np.random.default_rng(2).normal(size=1000))
    assert g is not None and all(a <= b for a, b in zip(g, g[1:]))
    assert cdf_grid(np.array([np.nan])) is None
