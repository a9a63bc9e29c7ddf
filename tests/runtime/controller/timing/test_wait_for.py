"""Waiting for a CUDA event (:func:`~kdvfs.runtime.controller.timing.gpu_timeline.wait_for`) without a GPU: an
event that completes at a given time on a fake clock, whose sleeps move that clock."""

from __future__ import annotations

import math

import pytest

from kdvfs.runtime.controller.timing import gpu_timeline
from kdvfs.runtime.controller.timing.gpu_timeline import POLL_S, wait_for


class FakeTime:
    def __init__(self) -> None:
        self.now_s = 0.0

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


class Event:
    """Done once the fake clock reaches ``done_s``."""

    def __init__(self, clock: FakeTime, done_s: float) -> None:
        self.clock, self.done_s = clock, done_s

    def query(self) -> bool:
        return self.clock.now_s >= self.done_s


@pytest.mark.parametrize("step_s", [0.02, 0.07, 0.3])
def test_a_step_end_expected_is_slept_towards_in_halves_not_looked_at_every_poll(
        monkeypatch: pytest.MonkeyPatch, step_s: float) -> None:
    """Told when the event is expected, the wait sleeps half the time left at each look: a few looks whatever
    the step's length (about log2 of it in polls), then one a poll once it is late; untold, one a poll. It
    returns its sleeps, and never after the event by more than a poll."""
    for expected_s, late_s in ((step_s, 0.0), (step_s, 0.004), (-math.inf, 0.0)):
        clock = FakeTime()
        monkeypatch.setattr(gpu_timeline.time, "sleep", clock.sleep)
        sleeps = wait_for(Event(clock, step_s + late_s), expected_s, lambda clock=clock: clock.now_s)
        assert step_s + late_s <= clock.now_s <= step_s + late_s + POLL_S + 1e-12
        if expected_s == -math.inf:
            assert sleeps == math.ceil((step_s + late_s) / POLL_S - 1e-9)
        else:
            assert sleeps <= math.log2(step_s / POLL_S) + 2 + late_s / POLL_S
