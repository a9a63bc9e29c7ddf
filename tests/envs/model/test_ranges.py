"""Two-sided ranges: the stated coverage on data of known distribution, never one-sided, shares of a step moved."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.model.ranges import (
    MIN_HALF_WIDTH,
    changed_shares,
    log_bounds,
    quantile_levels,
    saving_range_pct,
    scaled,
    slowdown_range_pct,
)
from kdvfs.envs.model.schedule import ActionCosts


def test_quantile_levels_are_the_split_conformal_order_statistics() -> None:
    assert quantile_levels(39) == (2 / 39, 38 / 39)  # floor(40 * 0.05) = 2, ceil(40 * 0.95) = 38
    assert quantile_levels(24) == (1 / 24, 24 / 24)  # 25 * 0.05 < 2: the extremes
    assert quantile_levels(5) == (1 / 5, 1.0)  # too few for 90%: the extremes, coverage not guaranteed
    with pytest.raises(KdvfsError):
        quantile_levels(0)
    with pytest.raises(KdvfsError):
        quantile_levels(10, coverage=1.0)


@pytest.mark.parametrize("draw", [
    lambda rng, n: rng.normal(0.02, 0.03, n),  # a biased model
    lambda rng, n: rng.standard_t(2, n) * 0.02,  # heavy tails
])
def test_ranges_cover_90_percent_of_fresh_errors_of_a_known_distribution(draw) -> None:  # type: ignore[no-untyped-def]
    """Residuals from a known distribution build a range; a fresh error from the same distribution falls inside
    90% of the time (split conformal with 39 residuals: exactly 36/40 in expectation)."""
    rng = np.random.default_rng(7)
    hits = []
    for _ in range(4000):
        low, high = log_bounds(np.zeros(1), [(draw(rng, 39), 1.0)])
        fresh = draw(rng, 1)[0]
        hits.append(low <= fresh <= high)
    assert np.mean(hits) == pytest.approx(0.9, abs=0.015)


def test_parameter_deviations_and_residuals_combine_to_the_stated_coverage() -> None:
    """A figure whose error is a parameter deviation (one of a known sample, equally likely) plus a model error:
    the combined range holds 90% of fresh errors, where either part alone holds far fewer."""
    rng = np.random.default_rng(3)
    deviations = rng.uniform(-0.05, 0.05, 16)
    hits, residual_only = [], []
    for _ in range(3000):
        residuals = rng.normal(0.0, 0.03, 59)
        fresh = rng.choice(deviations) + rng.normal(0.0, 0.03)
        low, high = log_bounds(deviations, [(residuals, 1.0)])
        hits.append(low <= fresh <= high)
        low, high = log_bounds(np.zeros(1), [(residuals, 1.0)])
        residual_only.append(low <= fresh <= high)
    assert np.mean(hits) == pytest.approx(0.9, abs=0.03)
    assert np.mean(residual_only) < 0.85


finite = st.floats(-0.5, 0.5, allow_nan=False)


@given(deviations=st.lists(finite, min_size=0, max_size=8),
       residuals=st.lists(st.lists(finite, min_size=1, max_size=30), min_size=0, max_size=2),
       weights=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=2),
       value=st.floats(1e-3, 1e4), ratio=st.floats(0.5, 2.0))
def test_a_range_is_never_one_sided(deviations: list[float], residuals: list[list[float]], weights: list[float],
                                    value: float, ratio: float) -> None:
    terms = [(np.array(r), w) for r, w in zip(residuals, weights, strict=False)]
    low, high = log_bounds(np.array(deviations), terms)
    if not any(deviations) and all(w == 0 for _, w in terms):
        assert low == high == 0.0  # nothing varies: exact by definition
        return
    assert low <= -MIN_HALF_WIDTH < 0 < MIN_HALF_WIDTH <= high
    figure_low, figure_high = scaled(value, (low, high))
    assert figure_low < value < figure_high
    saved, slowdown = saving_range_pct(ratio, (low, high)), slowdown_range_pct(ratio, (low, high))
    assert saved[0] < 100 * (1 - ratio) < saved[1] and slowdown[0] < 100 * (ratio - 1) < slowdown[1]


def test_changed_shares_count_the_auto_time_and_energy_of_moved_kernels() -> None:
    costs = ActionCosts(time_s=np.array([[2.0, 1.0], [3.0, 3.0]]), energy_j=np.array([[1.0, 1.0], [2.0, 3.0]]),
                        core_mhz=np.array([1000.0, math.nan]), mem_mhz=np.array([3201.0, 3201.0]), auto_index=1,
                        idle_power_w=np.array([80.0, 100.0]))
    assert changed_shares(costs, np.array([1, 1])) == (0.0, 0.0)
    assert changed_shares(costs, np.array([0, 1])) == (0.25, 0.25)
    assert changed_shares(costs, np.array([0, 0])) == (1.0, 1.0)
