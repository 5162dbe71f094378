"""oracle/quantile_band.py: what a short cell's p90 centres on, from a long run."""

from __future__ import annotations

import numpy as np
import pytest

from connector_tax.oracle.quantile_band import (
    band_tax,
    expected_order_statistic,
    expected_sample_quantile,
    point_tax,
    windowed_tax,
)


def test_order_statistics_of_a_uniform_population_are_k_over_n_plus_1() -> None:
    population = (np.arange(100_000) + 0.5) / 100_000
    for k in (1, 32, 58, 64):
        assert expected_order_statistic(population, k, 64) == pytest.approx(k / 65, abs=1e-4)


def test_the_sample_p90_interpolates_numpy_s_way() -> None:
    population = (np.arange(100_000) + 0.5) / 100_000
    # numpy's linear p90 of 64 draws: h = 63 * 0.9 = 56.7, 0.3 of X(57) and 0.7 of X(58)
    assert expected_sample_quantile(population, 64) == pytest.approx((0.3 * 57 + 0.7 * 58) / 65, abs=1e-4)


def test_on_a_lumpy_population_it_is_the_mean_of_many_cells_p90s() -> None:
    """Three step times, the p90 on the edge between two: a cell's p90 averages across it."""
    rng = np.random.default_rng(3)
    population = np.repeat([4.4, 4.6, 4.9], [800, 110, 90])
    cells = [np.percentile(rng.choice(population, 64), 90) for _ in range(20_000)]
    expected = expected_sample_quantile(population, 64)
    assert expected == pytest.approx(float(np.mean(cells)), rel=2e-3)
    assert abs(expected - np.quantile(population, 0.9)) > 0.02  # not the point value


def test_a_band_tax_differs_from_the_point_tax_where_the_tax_changes_across_the_band() -> None:
    u = (np.arange(50_000) + 0.5) / 50_000
    base = 1.0 + u
    smooth = base * 1.05  # the same tax at every level: band and point agree
    assert band_tax(smooth, base, 64) == pytest.approx(0.05, abs=1e-9)
    assert point_tax(smooth, base) == pytest.approx(0.05, abs=1e-9)
    step = base + 0.05 * (u >= 0.895)  # a cost only in the top 10.5 %: the p90 sits on its edge
    assert point_tax(step, base) == pytest.approx(0.05 / 1.9, rel=1e-3)
    assert 0.005 < band_tax(step, base, 64) < 0.02  # a 64-request p90 lands below the edge half the time
    assert band_tax(step, base, 2000) > band_tax(step, base, 64)  # longer cells close in on the point


@pytest.mark.parametrize(("k", "n"), [(0, 64), (65, 64)])
def test_an_order_statistic_outside_the_sample_is_refused(k: int, n: int) -> None:
    with pytest.raises(ValueError, match=f"{k} of {n}"):
        expected_order_statistic(np.ones(10), k, n)


def test_a_quantile_of_one_draw_is_refused() -> None:
    with pytest.raises(ValueError, match="not 1"):
        expected_sample_quantile(np.ones(10), 1)


def test_windows_see_the_tax_of_their_own_load_where_independent_requests_see_the_pooled_one() -> None:
    """Load that changes from window to window: the baseline alternates between light (1.0) and
    heavy (2.0) windows of 64 requests, and the variant pays 50 % only when heavy. Pooled, the
    p90s are both in the heavy windows (a 50 % tax, and so is an independent 64-request draw's);
    a window's p90 is of its own load, so the windows average 0 % and 50 %."""
    light, heavy = np.ones(64), np.full(64, 2.0)
    baseline = np.concatenate([light, heavy] * 50)
    variant = np.concatenate([light, 1.5 * heavy] * 50)
    assert point_tax(variant, baseline) == pytest.approx(0.5)
    assert band_tax(variant, baseline, 64) == pytest.approx(0.5, abs=0.01)
    assert windowed_tax(variant, baseline, 64) == pytest.approx(0.25)


def test_the_windows_are_consecutive_and_whole() -> None:
    rng = np.random.default_rng(5)
    baseline, variant = rng.gamma(4.0, size=200), rng.gamma(4.0, size=200) * 1.2
    by_hand = np.mean(
        [np.percentile(variant[i : i + 64], 90) / np.percentile(baseline[i : i + 64], 90) for i in (0, 64, 128)]
    )
    # the last 8 requests make no window
    assert windowed_tax(variant, baseline, 64) == pytest.approx(by_hand - 1.0)


@pytest.mark.parametrize(
    ("sizes", "n", "what"), [((100, 99), 10, "paired"), ((100, 100), 1, "2 or more"), ((50, 50), 64, "window")]
)
def test_windows_of_unpaired_runs_or_of_no_request_are_refused(sizes: tuple[int, int], n: int, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        windowed_tax(np.ones(sizes[0]), np.ones(sizes[1]), n)
