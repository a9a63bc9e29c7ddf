"""The A/B estimate of windows of mixed steps: adjusted for the shape mix, it holds the truth at the nominal
rate with a narrow interval, where the pairs' mean is wide, also when windows differ in noise."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from kdvfs.runtime.controller.measurement.ab import CONTROLLED, AbSchedule
from kdvfs.runtime.controller.measurement.estimator import Paired, WindowRow, adjusted, design

WINDOWS = 40


def windows(seed: int, effect: float, auto_noise: float = 0.003) -> list[WindowRow]:
    """``WINDOWS`` windows of the A/B schedule (a quarter at auto): each window's joules per step follow its
    steps' expected kernel time (the shape mix varies from window to window by +-30%), its count of new inputs
    (set-up costs 3x a step) and a drift, with 0.3% noise (``auto_noise`` at auto); controlled windows are
    ``effect`` lower."""
    rng = np.random.default_rng(seed)
    schedule = AbSchedule(0.25, seed)
    rows = []
    for index in range(WINDOWS):
        kernel = rng.uniform(0.7, 1.3)
        new = rng.uniform(0.0, 0.3) * max(0.0, 1 - index / 20)  # new shapes thin out as the run goes on
        controlled = schedule.next().arm == CONTROLLED
        noise = rng.normal(0, 0.003 if controlled else auto_noise)
        value = (100.0 * kernel + 20.0 + 300.0 * new) * (1 + 0.0005 * index) * (1 + noise)
        rows.append(WindowRow(controlled, value * (1 - effect if controlled else 1), kernel, (new,), float(index)))
    return rows


def test_the_adjusted_interval_holds_the_truth_at_the_nominal_rate() -> None:
    for effect in (0.0, 0.05):
        estimates = [adjusted(windows(seed, effect), sign=-1.0) for seed in range(200)]
        assert all(e is not None for e in estimates)
        held = sum(e.lo_pct <= 100 * effect <= e.hi_pct for e in estimates if e is not None)
        assert 180 <= held <= 200  # 95% nominal: 190 expected
        assert max(e.half_width_pct for e in estimates if e is not None) < 2.0


def pooled_interval_holds_zero(rows: list[WindowRow]) -> bool:
    """The interval :func:`adjusted` had before HC3: one residual variance pooled over every window."""
    x = np.array([[1.0, float(r.controlled), r.kernel_steps, r.new_inputs[0], r.mid_s] for r in rows])
    y = np.array([r.value for r in rows])
    inverse = np.linalg.inv(x.T @ x)
    beta = inverse @ x.T @ y
    residual = y - x @ beta
    dof = len(rows) - x.shape[1]
    half = stats.t.ppf(0.975, dof) * np.sqrt(residual @ residual / dof * inverse[1, 1])
    return bool(abs(beta[1]) <= half)


def test_the_interval_holds_when_windows_at_auto_are_noisier() -> None:
    """Auto windows with 1% noise, controlled ones 0.3% (unequal noise, a quarter of the windows at auto):
    the pooled residual variance under-covers, HC3 holds the nominal rate."""
    runs = [windows(seed, 0.0, auto_noise=0.01) for seed in range(200)]
    assert sum(pooled_interval_holds_zero(rows) for rows in runs) < 170
    estimates = [adjusted(rows, sign=-1.0) for rows in runs]
    assert all(e is not None for e in estimates)
    assert 180 <= sum(e.lo_pct <= 0.0 <= e.hi_pct for e in estimates if e is not None) <= 200
    assert max(e.half_width_pct for e in estimates if e is not None) < 2.0


def test_the_pairs_mean_of_mixed_windows_is_far_wider() -> None:
    rows = windows(0, 0.0)
    paired = Paired()
    auto = [r for r in rows if not r.controlled]
    for a, b in zip(auto, [r for r in rows if r.controlled], strict=False):
        paired.add(100 * (1 - b.value / a.value))
    adjusted_interval, paired_interval = adjusted(rows, sign=-1.0), paired.interval()
    assert adjusted_interval is not None and paired_interval is not None
    assert adjusted_interval.half_width_pct * 5 < paired_interval.half_width_pct


def test_too_few_windows_of_an_arm_give_no_estimate() -> None:
    rows = windows(1, 0.0)
    assert adjusted([r for r in rows if r.controlled][:5] + [r for r in rows if not r.controlled][:1]) is None
    assert adjusted(rows[:3]) is None


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_covariates_that_do_not_vary_are_left_out(sign: float) -> None:
    """A run of one shape: no kernel or new-shape variation, the arm and the drift only."""
    rows = [WindowRow(i % 2 == 0, 10.0 * (1.02 if i % 2 == 0 else 1.0) + 0.01 * i, 1.0, (), float(i))
            for i in range(12)]
    interval = adjusted(rows, sign)
    assert interval is not None and interval.mean_pct == pytest.approx(2.0 * sign, abs=0.1)


def test_a_covariate_that_differs_in_one_window_only_is_left_out() -> None:
    """Every window's steps new to the process but one's (a run whose shapes keep coming): that window alone would
    fix the share's coefficient (leverage 1), so the share is left out and the estimate stands."""
    rows = [WindowRow(r.controlled, r.value, r.kernel_steps, (0.9 if i == 7 else 1.0,), r.mid_s)
            for i, r in enumerate(windows(2, 0.05))]
    interval = adjusted(rows, -1.0)
    assert interval is not None and interval.lo_pct < 5.0 < interval.hi_pct  # a 5% saving


def test_new_inputs_enter_by_position_each_distinct_column_once() -> None:
    """A packed batch: its tokens (three inputs that share a shape) cost set-up when new, its longest sample's
    length does not. By position the estimate is exact; with only the first position's count it is not; the
    three identical columns enter once (the design has full rank)."""
    rng = np.random.default_rng(3)
    rows, first_only = [], []
    for index in range(24):
        tokens, longest = rng.uniform(0.5, 1.0), rng.uniform(0.0, 1.0)
        controlled = index % 3 != 0
        value = (20.0 + 8.0 * tokens + 0.3 * rng.normal()) * (0.95 if controlled else 1.0)
        rows.append(WindowRow(controlled, value, 1.0, (tokens, tokens, longest, tokens), float(index)))
        first_only.append(WindowRow(controlled, value, 1.0, (tokens + longest,), float(index)))
    x, _ = design(rows)
    assert x.shape[1] == 5  # ones, arm, tokens, longest, time
    by_position, summed = adjusted(rows, -1.0), adjusted(first_only, -1.0)
    assert by_position is not None and summed is not None
    assert by_position.half_width_pct < summed.half_width_pct
    assert by_position.lo_pct <= 5.0 <= by_position.hi_pct
