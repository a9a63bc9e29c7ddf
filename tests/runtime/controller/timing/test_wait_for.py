"""Waiting for a CUDA event (:func:`~kdvfs.runtime.controller.timing.gpu_timeline.wait_for`) without a GPU: an
event that completes at a given time on a fake clock, whose sleeps move that clock."""

from __future__ import annotations

import math

import pytest

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
def test_a_step_end_expected_is_slept_towards_once_then_looked_at_every_poll(step_s: float) -> None:
    """Told when the event is expected, the wait sleeps once to a poll before then and looks every poll after:
    two looks for an event on time whatever the step's length, one more a poll it is late; untold, one a poll.
    It returns its sleeps, and never after the event by more than a poll."""
    for expected_s, late_s in ((step_s, 0.0), (step_s, 0.004), (-math.inf, 0.0)):
        clock = FakeTime()
        sleeps = wait_for(Event(clock, step_s + late_s), expected_s, lambda clock=clock: clock.now_s, clock.sleep)
        assert step_s + late_s <= clock.now_s <= step_s + late_s + POLL_S + 1e-12
        if expected_s == -math.inf:
            assert sleeps == math.ceil((step_s + late_s) / POLL_S - 1e-9)
        else:
            assert sleeps <= 2 + math.ceil(late_s / POLL_S - 1e-9) + 1


def test_an_event_done_early_is_seen_at_the_first_look() -> None:
    """An event the GPU passed well before it was expected is seen at the first look, a poll before the expected
    time: one sleep, as late as it was early (less a poll)."""
    clock = FakeTime()
    sleeps = wait_for(Event(clock, 0.03), 0.07, lambda: clock.now_s, clock.sleep)
    assert sleeps == 1
    assert clock.now_s == pytest.approx(0.07 - POLL_S)


def test_an_expected_time_already_past_is_looked_at_every_poll() -> None:
    clock = FakeTime()
    clock.now_s = 0.1
    assert wait_for(Event(clock, 0.1035), 0.05, lambda: clock.now_s, clock.sleep) == 4
