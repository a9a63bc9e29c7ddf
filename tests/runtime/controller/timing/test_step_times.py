"""Host times of the expected step's kernels: the auto scale before the pace, the pace after it."""

from __future__ import annotations

import numpy as np
import pytest

from kdvfs.runtime.controller.timing.anchors import AnchorMap
from kdvfs.runtime.controller.timing.gpu_timeline import StepEnd
from kdvfs.runtime.controller.timing.pace import Pace
from kdvfs.runtime.controller.timing.step_times import SCALE_STEPS, StepTimes

# Four kernels of 1 ms at auto (pair 0) and 2 ms at pair 1: starts and the step's end.
CUMULATIVE_S = np.array([[0.0, 0.0], [1e-3, 2e-3], [2e-3, 4e-3], [3e-3, 6e-3], [4e-3, 8e-3]])


def test_before_the_pace_the_model_timeline_is_stretched_by_the_median_auto_scale() -> None:
    times = StepTimes(CUMULATIVE_S, 4e-3, AnchorMap(CUMULATIVE_S[:, 0], 4e-3), Pace())
    assert list(times.at(1)) == pytest.approx(list(CUMULATIVE_S[:, 1]))
    for duration_s in (4.4e-3, 4.8e-3, 4.4e-3, 9e-3):  # matched and at auto: 1.1, 1.2, 1.1, 2.25
        times.observe(StepEnd(0.0, duration_s, None), matched=True, controlled=False)
    times.observe(StepEnd(0.0, 40e-3, None), matched=True, controlled=True)  # controlled: not auto's
    times.observe(StepEnd(0.0, 40e-3, None), matched=False, controlled=False)  # another step
    assert times.auto_scale == pytest.approx(1.15) and SCALE_STEPS >= 4
    assert list(times.at(0)) == pytest.approx(list(1.15 * CUMULATIVE_S[:, 0]))
    anchor = (-1, 10.0, 0)  # none passed: the step's start, at host 10 s
    assert times.kernel_s(anchor, 1, 3) == pytest.approx(10.0 + 1.15 * 6e-3)
    assert times.kernel_running(anchor, 0, 10.0 + 1.15 * 2.5e-3) == 2
    assert times.kernel_running(anchor, 0, 10.0 + 1.0) == 3  # never past the last kernel
    assert times.end_s(anchor, 10.0, 5e-3) == 10.0 + 5e-3


def test_after_an_anchor_times_and_the_end_count_from_it_at_the_steps_pace() -> None:
    anchor_map = AnchorMap(CUMULATIVE_S[:, 0], 4e-3)
    pace = Pace()
    for _ in range(5):  # one anchor at kernel 2; the half before it runs 3 ms, the half after 1 ms
        anchor_map.observe(0.0, 4e-3, [2e-3])
        pace.observe(0.0, 4e-3, [3e-3])
    assert [a.kernel for a in anchor_map.anchors] == [2]
    times = StepTimes(CUMULATIVE_S, 4e-3, anchor_map, pace)
    assert list(times.at(0)) == pytest.approx([0.0, 1.5e-3, 3e-3, 3.5e-3, 4e-3])
    anchor = (0, 20.0, 2)  # the GPU passed the anchor (kernel 2) at host 20 s
    assert times.kernel_s(anchor, 0, 3) == pytest.approx(20.0 + 0.5e-3)
    assert times.kernel_running(anchor, 0, 20.0 + 0.7e-3) == 3
    assert times.kernel_running(anchor, 0, 19.0) == 2  # never before the anchor's kernel
    assert times.end_s(anchor, 0.0, 4e-3) == pytest.approx(20.0 + 4e-3 * 1e-3 / 4e-3)


def test_host_times_are_found_again_only_when_what_they_come_from_changed() -> None:
    """A step after which the pace, the anchor map and the auto scale are as they were (a controlled step of a run
    whose pace learns at auto) keeps the host times; a pace learned anew, or a new auto scale, finds them again."""
    anchor_map, pace = AnchorMap(CUMULATIVE_S[:, 0], 4e-3), Pace()
    for _ in range(5):
        anchor_map.observe(0.0, 4e-3, [2e-3])
        pace.observe(0.0, 4e-3, [3e-3])
    times = StepTimes(CUMULATIVE_S, 4e-3, anchor_map, pace)
    kept = times.at(0)
    times.observe(StepEnd(5.0, 4e-3, None, (4.997,)), matched=True, controlled=True)
    assert times.at(0) is kept
    pace.observe(0.0, 4e-3, [2e-3])
    times.observe(StepEnd(9.0, 4e-3, None, (8.997,)), matched=True, controlled=True)
    assert times.at(0) is not kept and list(times.at(0)) == list(kept)  # the median of five steps held
    kept = times.at(0)
    times.observe(StepEnd(13.0, 4.4e-3, None, (12.997,)), matched=True, controlled=False)  # a new auto scale
    assert times.at(0) is not kept
