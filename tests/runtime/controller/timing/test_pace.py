"""The step's pace: live segment durations learned from the last steps, and times on a timeline put at them
(against a direct sum over the segments)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdvfs.runtime.controller.timing.pace import PACE_STEPS, Pace, RecentRows, host_offsets_s, medians


def _direct_s(segments_s: list[float], knots_s: list[float], time_s: float, reference_s: list[float]) -> float:
    """Host time at ``time_s``: the whole segments before it, and its own segment's share up to it."""
    host_s = 0.0
    for j, live_s in enumerate(segments_s):
        lo_s, hi_s = knots_s[j], knots_s[j + 1]
        host_s += live_s / (reference_s[j + 1] - reference_s[j]) * (min(max(time_s, lo_s), hi_s) - lo_s)
    return host_s


@given(st.lists(st.tuples(st.floats(0.1, 10), st.floats(0.1, 10), st.floats(0.5, 2)), min_size=2, max_size=8),
       st.floats(0, 1))
def test_times_are_placed_in_their_segment_at_its_live_pace(
        parts: list[tuple[float, float, float]], where: float) -> None:
    timeline, live, ratio = zip(*parts, strict=True)
    knots_s = np.concatenate([[0.0], np.cumsum(timeline)])
    reference_s = np.concatenate([[0.0], np.cumsum(np.asarray(timeline) * ratio)])  # measured at other clocks
    time_s = where * knots_s[-1]
    expected_s = _direct_s(list(live), list(knots_s), time_s, list(knots_s))
    assert host_offsets_s(np.array(live), knots_s, time_s) == pytest.approx(expected_s, rel=1e-9, abs=1e-12)
    stretched_s = _direct_s(list(live), list(knots_s), time_s, list(reference_s))
    assert host_offsets_s(np.array(live), knots_s, time_s, reference_s) == pytest.approx(stretched_s, rel=1e-9,
                                                                                          abs=1e-12)
    assert host_offsets_s(np.array(live), knots_s, knots_s[-1] + 1.0) == pytest.approx(sum(live))  # the end's


def test_the_pace_is_the_median_of_each_segment_over_the_last_steps() -> None:
    pace = Pace()
    rng = np.random.default_rng(0)
    seen = []
    for step in range(PACE_STEPS + 2):
        start_s = 10.0 * step
        segments = [0.001 * (1 + step % 3), 0.004, 0.002 + 0.001 * rng.random()]
        seen.append(segments)
        pace.observe(start_s, start_s + sum(segments), list(start_s + np.cumsum(segments[:-1])))
        learned = step + 1 >= PACE_STEPS
        assert (pace.segments_s is not None) == learned and (pace.for_anchors(2) is not None) == learned
    assert pace.segments_s == pytest.approx(np.median(seen[-PACE_STEPS:], axis=0))
    assert pace.for_anchors(3) is None and pace.for_anchors(0) is None


def test_another_anchor_count_starts_again_and_disorder_is_ignored() -> None:
    pace = Pace()
    for step in range(PACE_STEPS):
        pace.observe(step, step + 0.5, [step + 0.1, step + 0.3])
    before = pace.segments_s
    pace.observe(9.0, 9.5, [9.3, 9.1])  # out of order
    pace.observe(9.0, 9.2, [9.1, 9.3])  # after the step's end
    assert before is not None and pace.segments_s is before
    pace.observe(10.0, 10.5, [10.2])
    assert pace.segments_s is None and pace.for_anchors(2) is None


@settings(deadline=None)  # the first call loads the compiled medians
@given(rows=st.integers(1, 7).flatmap(lambda n: st.lists(st.lists(
    st.floats(allow_nan=True, allow_infinity=True) | st.floats(-1.0, 1.0), min_size=n, max_size=n),
    min_size=1, max_size=6)))
def test_medians_are_numpys_median_of_each_position(rows: list[list[float]]) -> None:
    history = [np.array(row) for row in zip(*rows, strict=True)]  # as many arrays as steps, one value a position
    assert np.array_equal(medians(history), np.median(np.stack(history), axis=0), equal_nan=True)


@settings(deadline=None)
@given(st.lists(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=3), min_size=1,
                max_size=12), st.integers(1, 5))
def test_recent_rows_hold_the_last_rows_of_one_length(rows: list[list[float]], size: int) -> None:
    """The medians of the last ``size`` rows since the last change of length, as a list of those rows gives."""
    recent, kept = RecentRows(size), []
    for row in rows:
        kept = [*(kept if kept and len(kept[-1]) == len(row) else []), np.array(row)][-size:]
        recent.append(np.array(row))
        assert recent.width == len(row) and recent.count == len(kept) and recent.full == (len(kept) == size)
        assert np.array_equal(recent.medians(), medians(kept), equal_nan=True)
    recent.clear()
    assert recent.width is None and recent.count == 0
