"""Waiting for the GPU to pass an item (:func:`~kdvfs.runtime.controller.timing.gpu_timeline.wait_for`) without a
GPU: an event that completes at a given time on a fake clock, whose sleeps move that clock."""

from __future__ import annotations

import math

import pytest

from kdvfs.runtime.controller.timing.gpu_timeline import LATE_SHARE, MAX_POLL_S, POLL_S, wait_for


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
    """Told when the event is expected, the wait sleeps once to a poll before then and looks every poll after while
    it is a little late: two looks for an event on time whatever the step's length, one more a poll it is late, and
    never after the event by more than a poll."""
    for late_s in (0.0, 0.004):
        clock = FakeTime()
        sleeps = wait_for(Event(clock, step_s + late_s).query, step_s, lambda clock=clock: clock.now_s, clock.sleep)
        assert step_s + late_s <= clock.now_s <= step_s + late_s + POLL_S + 1e-12
        assert sleeps <= 2 + math.ceil(late_s / POLL_S - 1e-9) + 1


@pytest.mark.parametrize(("expected_s", "done_s"), [(0.07, 10.0), (0.07, 0.5), (-math.inf, 0.3), (-math.inf, 5.0)])
def test_a_late_event_is_looked_at_further_apart_the_later_it_is(expected_s: float, done_s: float) -> None:
    """Late (an evaluation pass between two steps), or with no expected time, the wait looks every ``LATE_SHARE`` of
    its lateness, at least a poll and at most ``MAX_POLL_S`` apart: a few dozen looks for seconds late, not one a
    poll, and the event seen at most that late."""
    clock = FakeTime()
    sleeps = wait_for(Event(clock, done_s).query, expected_s, lambda: clock.now_s, clock.sleep)
    late_s = done_s - max(expected_s, 0.0)
    assert done_s <= clock.now_s <= done_s + max(POLL_S, min(MAX_POLL_S, LATE_SHARE * late_s)) + 1e-9
    assert sleeps <= 2 + math.log(max(late_s, POLL_S) / POLL_S) / math.log(1 + LATE_SHARE) + late_s / MAX_POLL_S
    assert sleeps < late_s / POLL_S / 4


def test_an_event_done_early_is_seen_at_the_first_look() -> None:
    """An event the GPU passed well before it was expected is seen at the first look, a poll before the expected
    time: one sleep, as late as it was early (less a poll)."""
    clock = FakeTime()
    sleeps = wait_for(Event(clock, 0.03).query, 0.07, lambda: clock.now_s, clock.sleep)
    assert sleeps == 1
    assert clock.now_s == pytest.approx(0.07 - POLL_S)


def test_an_expected_time_already_past_is_looked_at_every_poll() -> None:
    clock = FakeTime()
    clock.now_s = 0.1
    assert wait_for(Event(clock, 0.1035).query, 0.05, lambda: clock.now_s, clock.sleep) == 4
