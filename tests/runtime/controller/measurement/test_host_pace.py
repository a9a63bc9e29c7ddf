"""The host pace as a covariate of the A/B estimate: the pace of a step from its hooks' host times, and the
estimate with it, which narrows where a shared host's speed moves the windows and leaves the pace out where the
arm moves it (a host that keeps the GPU's pace)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdvfs.runtime.controller.config import ControllerConfig, MeasurementConfig
from kdvfs.runtime.controller.event_log import EventLog
from kdvfs.runtime.controller.measurement import accounting
from kdvfs.runtime.controller.measurement.ab import CONTROLLED, AbSchedule
from kdvfs.runtime.controller.measurement.estimator import WindowRow, adjusted, arm_moves, design
from kdvfs.runtime.controller.timing.gpu_timeline import MIN_PACE_GAPS, host_pace_s
from kdvfs.runtime.testing.fake_gpu import VirtualClock

WINDOWS = 28


def test_the_pace_leaves_out_the_waits_and_needs_enough_gaps() -> None:
    """Twelve launches of 1 ms and two waits of 60 ms: the pace is the launches'; under four gaps, none."""
    gaps_s = [0.001] * 6 + [0.06] + [0.001] * 6 + [0.06]
    times_s = np.concatenate([[0.0], np.cumsum(gaps_s)])
    assert host_pace_s(list(times_s)) == pytest.approx(0.001)
    assert host_pace_s([0.0, 0.001, 0.002, 0.003]) is None
    assert host_pace_s(list(np.arange(MIN_PACE_GAPS + 1) * 0.002)) == pytest.approx(0.002)


@given(st.lists(st.floats(0.0, 1.0), min_size=MIN_PACE_GAPS, max_size=60))
def test_the_pace_lies_within_the_gaps(gaps_s: list[float]) -> None:
    times_s = list(np.concatenate([[0.0], np.cumsum(gaps_s)]))
    pace_s = host_pace_s(times_s)
    assert pace_s is not None
    assert min(gaps_s) - 1e-12 <= pace_s <= max(gaps_s) + 1e-12


def windows(seed: int, effect: float, pace_spread: float = 0.2, pace_effect: float = 0.0) -> list[WindowRow]:
    """``WINDOWS`` windows of the A/B schedule (a quarter at auto) whose joules per step follow the shape mix and,
    mostly, the host's pace (a shared host: +-``pace_spread`` from window to window), with 0.3% noise; controlled
    windows are ``effect`` lower, and their pace ``pace_effect`` slower (a host that waits on the GPU)."""
    rng = np.random.default_rng(seed)
    schedule = AbSchedule(0.25, seed)
    rows = []
    for index in range(WINDOWS):
        kernel, pace_s = rng.uniform(0.9, 1.1), 0.001 * rng.uniform(1 - pace_spread, 1 + pace_spread)
        controlled = schedule.next().arm == CONTROLLED
        pace_s *= 1 + (pace_effect if controlled else 0.0)
        value = (40.0 * kernel + 60_000.0 * pace_s) * (1 + rng.normal(0, 0.003))
        rows.append(WindowRow(controlled, value * (1 - effect if controlled else 1), kernel, (), float(index), pace_s))
    return rows


def without_pace(rows: list[WindowRow]) -> list[WindowRow]:
    return [WindowRow(r.controlled, r.value, r.kernel_steps, r.new_inputs, r.mid_s) for r in rows]


def test_the_pace_narrows_the_interval_and_it_holds_the_truth() -> None:
    for effect in (0.0, 0.05):
        paced = [adjusted(windows(seed, effect), sign=-1.0) for seed in range(200)]
        plain = [adjusted(without_pace(windows(seed, effect)), sign=-1.0) for seed in range(200)]
        assert all(e is not None for e in paced + plain)
        held = sum(e.lo_pct <= 100 * effect <= e.hi_pct for e in paced if e is not None)
        assert 178 <= held <= 200  # 95% nominal: 190 expected (a few runs leave the pace out by chance)
        assert np.median([e.half_width_pct for e in paced if e is not None]) < 0.2 * np.median(
            [e.half_width_pct for e in plain if e is not None])


def test_a_pace_the_arm_moves_is_left_out() -> None:
    """A host that keeps the GPU's pace (a full launch queue: its pace is the kernels', +-1% from window to
    window) and so runs 3% slower in controlled windows: the pace would absorb the effect, so the design leaves it
    out and the estimate is the one without it. (A pace the GPU moves a little on a host that is noisy as well
    can go unnoticed: docs/design/controller.md.)"""
    for seed in range(50):
        rows = windows(seed, 0.05, pace_spread=0.01, pace_effect=0.03)
        x, _ = design(without_pace(rows))
        assert arm_moves(x, np.array([r.host_pace_s for r in rows]))
        assert design(rows)[0].shape == x.shape
        paced, plain = adjusted(rows, sign=-1.0), adjusted(without_pace(rows), sign=-1.0)
        assert paced is not None and plain is not None
        assert paced.mean_pct == plain.mean_pct


def test_a_window_without_a_pace_leaves_it_out() -> None:
    rows = windows(0, 0.0)
    rows[3] = WindowRow(rows[3].controlled, rows[3].value, rows[3].kernel_steps, (), rows[3].mid_s, None)
    assert design(rows)[0].shape == design(without_pace(rows))[0].shape


def test_a_window_records_its_steps_mean_pace() -> None:
    """The accounting of a run whose steps vary: each window's pace is its steps' mean; a step without one
    leaves its window without one."""
    config = ControllerConfig(policy="plan.json", trace="t", measurement=MeasurementConfig(window_steps=5,
                                                                                          window_s=0.0))
    books = accounting.Accounting(None, VirtualClock(), config, 0, EventLog(None))
    books.covariates = lambda step: (1.0, (0.0,))
    books.start(0.1)
    for index in range(1, 21):
        pace_s = None if index == 13 else 0.001 * index
        books.step(index, 0.1, 0.1 * (index + 1), True, books.next_controlled, host_pace_s=pace_s)
    paces_s = [w.host_pace_s for w in books.windows]
    assert len(paces_s) == 4
    assert paces_s[0] == pytest.approx(0.003) and paces_s[1] == pytest.approx(0.008)
    assert paces_s[2] is None and paces_s[3] == pytest.approx(0.018)
