"""The energy counter read at its own pace (:mod:`kdvfs.runtime.device.energy_trace`), on a virtual clock."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import numpy as np
import pytest

from kdvfs.runtime.device.energy_trace import READ_GUARD_S, EnergyTrace
from kdvfs.runtime.testing.fake_gpu import VirtualClock
from kdvfs.runtime.testing.scripted_clock import ScriptedClock

POWER_W = 600.0


class Counter:
    """A counter of ``POWER_W`` that publishes its total at updates every ``period_s`` (from ``phase_s``) and
    takes ``read_s`` a read, on ``clock`` (``period_s`` 0: always current); it keeps each read's start."""

    def __init__(self, clock: VirtualClock, period_s: float, read_s: float = 0.005, phase_s: float = 0.037) -> None:
        self.clock, self.period_s, self.read_s, self.phase_s = clock, period_s, read_s, phase_s
        self.starts_s: list[float] = []

    def published_s(self, time_s: float) -> float:
        """The time of the last update at or before ``time_s``."""
        if self.period_s == 0:
            return time_s
        return self.phase_s + math.floor((time_s - self.phase_s) / self.period_s) * self.period_s

    def __call__(self) -> float:
        start_s = self.clock.now_s()
        self.starts_s.append(start_s)
        self.clock.advance_to(start_s + self.read_s / 2)
        value = POWER_W * self.published_s(self.clock.now_s())
        self.clock.advance_to(start_s + self.read_s)
        return value


def run(period_s: float, end_s: float, marks_s: list[float], read_every_s: float = 1.0,
        next_request_s: Callable[[], float] = lambda: math.inf, clocks: list[VirtualClock] | None = None
        ) -> tuple[EnergyTrace, Counter]:
    """A paced trace of a :class:`Counter` until virtual ``end_s``, marked at ``marks_s`` (its clock appended to
    ``clocks``, for a ``next_request_s`` that reads it)."""
    box: list[EnergyTrace] = []
    clock = ScriptedClock(end_s, [(mark_s, lambda mark_s=mark_s: box[0].mark(mark_s)) for mark_s in marks_s])
    if clocks is not None:
        clocks.append(clock)
    counter = Counter(clock, period_s)
    trace = EnergyTrace(counter, clock, read_every_s, next_request_s)
    box.append(trace)
    trace.start()
    assert clock.at_end.wait(30)
    trace.stop()
    return trace, counter


def test_the_counter_is_read_just_after_the_updates_around_each_mark_and_not_in_between() -> None:
    """The period is learned back to back; then each mark costs about two reads (the update before it, unless
    already read, and the one after it) and the thread otherwise reads one update a second: the reads follow
    the marks and the seconds, not the counter's updates; the energy between two marks is the counter's (within
    4 ms of power: each update is placed within about half a read of its time, and a constant offset
    cancels)."""
    marks_s = [2.0 + 0.7 * i + 0.013 * (i % 5) for i in range(80)]
    trace, _ = run(0.1, 60.0, marks_s)
    assert trace.updates is not None and trace.updates.period_s == pytest.approx(0.1, rel=0.01)
    paced = trace.reads - trace.calibration_reads - trace.relock_reads
    assert paced <= 2 * len(marks_s) + 60 / 1.0
    assert trace.relock_reads <= paced / 2  # a change is measured again now and then, in a few reads
    assert trace.reads - trace.calibration_reads < (60 - 2) / 0.1 / 2  # fewer than one read per two updates
    for start_s, end_s in itertools.pairwise(marks_s[:-1]):  # a window's energy, between two edges
        joules = trace.energy_j(end_s) - trace.energy_j(start_s)  # type: ignore[operator]
        assert joules == pytest.approx(POWER_W * (end_s - start_s), abs=POWER_W * 0.004)


@pytest.mark.parametrize("period_s", [0.0997, 0.1003])
def test_a_clock_that_drifts_from_the_learned_one_is_followed(period_s: float) -> None:
    """The updates come 0.3% faster or slower than every 0.1 s (the back-to-back learning sees about 0.1 s):
    the clock is measured again every few seconds and the energy between marks stays the counter's."""
    marks_s = [2.0 + 0.53 * i for i in range(100)]
    trace, _ = run(period_s, 58.0, marks_s)
    assert trace.updates is not None and trace.updates.period_s == pytest.approx(period_s, rel=1e-3)
    for start_s, end_s in itertools.pairwise(marks_s[20:-1]):
        joules = trace.energy_j(end_s) - trace.energy_j(start_s)  # type: ignore[operator]
        assert joules == pytest.approx(POWER_W * (end_s - start_s), abs=POWER_W * 0.004)


def test_no_read_starts_just_before_an_update_or_a_clock_request() -> None:
    """A read would be ambiguous across an update (it may see either value) and may hold up a clock request in
    the driver: reads start neither within a read of an update (but those back to back that measure one) nor
    within the guard of a request (requests every 0.25 s here, so a read can always wait until just after
    one)."""
    requests_s = [0.5 + 0.25 * i for i in range(200)]

    def next_request(clock: list[VirtualClock]) -> float:
        now_s = clock[0].now_s()
        return next((r for r in requests_s if r > now_s), math.inf)

    clocks: list[VirtualClock] = []
    marks_s = [3.0 + 0.61 * i for i in range(40)]
    box: list[EnergyTrace] = []
    clock = ScriptedClock(30.0, [(m, lambda m=m: box[0].mark(m)) for m in marks_s])
    clocks.append(clock)
    counter = Counter(clock, 0.1)
    box.append(EnergyTrace(counter, clock, 1.0, lambda: next_request(clocks)))
    box[0].start()
    assert clock.at_end.wait(30)
    box[0].stop()
    paced = counter.starts_s[box[0].calibration_reads + 1:]
    assert len(paced) > 2 * len(marks_s) / 2
    for start_s in paced:
        assert not any(0 < r - start_s < READ_GUARD_S for r in requests_s)
    straddling = [s for s in paced if counter.published_s(s + counter.read_s) > counter.published_s(s)]
    assert len(straddling) <= box[0].relock_reads  # only reads back to back to measure a change run into one


@pytest.mark.parametrize("gap_s", [0.003, 0.008])
def test_requests_milliseconds_apart_do_not_keep_the_clock_from_being_measured(gap_s: float) -> None:
    """In a controlled step clock requests come milliseconds apart, so one always falls within a change's
    measurement: it is put off for ``RELOCK_WAIT_S`` at most, then made, and the windows' energy stays the counter's
    (put off for good, the clock drifted off the updates and whole updates went to the wrong window)."""
    def next_request_s(clock: list[VirtualClock]) -> float:
        return 2.0 + gap_s * max(0, math.ceil((clock[0].now_s() - 2.0) / gap_s + 1e-9))

    clocks: list[VirtualClock] = []
    marks_s = [3.0 + 0.7 * i + 0.013 * (i % 5) for i in range(70)]
    trace, _ = run(0.1, 55.0, marks_s, next_request_s=lambda: next_request_s(clocks), clocks=clocks)
    assert trace.relock_reads > 0
    for start_s, end_s in itertools.pairwise(marks_s[:-1]):
        joules = trace.energy_j(end_s) - trace.energy_j(start_s)  # type: ignore[operator]
        assert joules == pytest.approx(POWER_W * (end_s - start_s), abs=POWER_W * 0.004)


def test_a_counter_without_a_period_is_read_at_the_marks_and_each_value_placed_at_its_read() -> None:
    trace, _ = run(0.0, 20.0, [1.0 + 0.5 * i for i in range(30)])
    assert trace.updates is None and trace.calibration_reads <= 4
    assert trace.reads - trace.calibration_reads - 1 <= 30 + 20
    assert trace.energy_j(10.0) == pytest.approx(POWER_W * 10.0, rel=1e-3)


class H200Counter(Counter):
    """An H200-like counter: updates about every 0.1 s (0.02% slower, wandering by up to half a millisecond
    over 25 s, each one off by up to 0.3 ms), reads of 3.1-4.7 ms (one in 25 of 9 ms) that see the counter at
    a random point inside them, and a power that changes at every mark (450 W and 620 W in turn)."""

    def __init__(self, clock: VirtualClock, marks_s: list[float], end_s: float, slow_share: float = 0.04) -> None:
        super().__init__(clock, 0.1)
        self.slow_share, self.slow_s = slow_share, 0.009
        self.rng = random.Random(51)
        self.updates_s = np.array([0.037 + n * 0.10002 + 0.0005 * math.sin(2 * math.pi * n * 0.1 / 25)
                                   + self.rng.uniform(-3e-4, 3e-4) for n in range(int(end_s / 0.1) + 2)])
        edges_s = np.array([0.0, *marks_s, end_s + 1.0])
        powers_w = np.where(np.arange(len(edges_s) - 1) % 2 == 0, 450.0, 620.0)
        self.edges_s, self.edges_j = edges_s, np.concatenate([[0.0], np.cumsum(powers_w * np.diff(edges_s))])

    def true_j(self, time_s: float) -> float:
        """The GPU's energy used by ``time_s`` (J)."""
        return float(np.interp(time_s, self.edges_s, self.edges_j))

    def published_s(self, time_s: float) -> float:
        return float(self.updates_s[np.searchsorted(self.updates_s, time_s, side="right") - 1])

    def ideal_j(self, time_s: float) -> float:
        """The value at ``time_s`` interpolated between the counter's updates around it (the best a reader can
        place it)."""
        return float(np.interp(time_s, self.updates_s, [self.true_j(s) for s in self.updates_s]))

    def __call__(self) -> float:
        start_s = self.clock.now_s()
        self.starts_s.append(start_s)
        read_s = self.slow_s if self.rng.random() < self.slow_share else self.rng.uniform(0.0031, 0.0047)
        self.clock.advance_to(start_s + self.rng.uniform(0, read_s))
        value = self.true_j(self.published_s(self.clock.now_s()))
        self.clock.advance_to(start_s + read_s)
        return value


def longest_burst(counter: Counter, skip: int) -> int:
    """The most reads in a row back to back (each starting as the one before ends), after the first ``skip``."""
    runs, run_reads = [1], 1
    for start_s, next_s in itertools.pairwise(counter.starts_s[skip:]):
        run_reads = run_reads + 1 if next_s - start_s <= 0.0101 else 1
        runs.append(run_reads)
    return max(runs)


def run_h200(end_s: float, marks_s: list[float], slow_share: float = 0.04, slow_s: float | None = None,
             seed: int | None = None) -> tuple[EnergyTrace, H200Counter]:
    """A paced trace of an :class:`H200Counter` (``slow_share`` of its reads taking ``slow_s``; ``seed``: its
    noise's) marked at ``marks_s``, run to ``end_s`` (virtual s)."""
    box: list[EnergyTrace] = []
    clock = ScriptedClock(end_s, [(m, lambda m=m: box[0].mark(m)) for m in marks_s])
    counter = H200Counter(clock, marks_s, end_s, slow_share=slow_share)
    if slow_s is not None:
        counter.slow_s = slow_s
    if seed is not None:
        counter.rng = random.Random(seed)
    box.append(EnergyTrace(counter, clock, 1.0))
    box[0].start()
    assert clock.at_end.wait(60)
    box[0].stop()
    return box[0], counter


def test_an_h200_like_counter_is_read_about_once_per_update_a_mark_needs() -> None:
    """Marks at window edges every 0.35-1 s for 60 s on an H200-like counter (:class:`H200Counter`): each mark
    needs the updates before and after it, and after the clock is learned the thread reads about once per such
    update, its own measuring of the clock included (not in bursts of a period); it places each window's energy
    (between two marks) within 4 ms of power of the best a reader can (the counter's updates around its edges,
    interpolated), and each mark's value within 8 ms of power of it (a clock a little off shifts every value
    alike)."""
    rng = random.Random(7)
    marks_s = list(itertools.accumulate([rng.uniform(0.35, 1.0) for _ in range(100)], initial=2.0))
    marks_s = [m for m in marks_s if m < 62.0]
    trace, counter = run_h200(64.0, marks_s)
    reads = trace.reads - trace.calibration_reads
    needs = len({counter.published_s(m) for m in marks_s} | {counter.published_s(m + 0.1) for m in marks_s})
    per_s = reads / (64.0 - counter.starts_s[trace.calibration_reads])
    print(f"{reads} reads after learning the clock ({per_s:.2f}/s, {reads / needs:.2f} a needed update, "
          f"{trace.relock_reads} measuring changes, at most {longest_burst(counter, trace.calibration_reads)} in a "
          f"row) for {len(marks_s)} marks")
    assert trace.updates is not None and trace.updates.period_s == pytest.approx(0.10002, rel=1e-3)
    assert trace.calibration_reads <= 40  # back to back: 4 changes in a row took 75 or more
    assert reads <= 1.25 * needs and per_s <= 3.6
    assert longest_burst(counter, trace.calibration_reads) <= 8
    errors_j = [trace.energy_j(m) - counter.ideal_j(m) for m in marks_s[1:-1]]  # type: ignore[operator]
    print(f"largest error at a mark {max(map(abs, errors_j)):.2f} J, in a window "
          f"{max(abs(b - a) for a, b in itertools.pairwise(errors_j)):.2f} J")
    assert max(map(abs, errors_j)) <= 620.0 * 0.008
    assert all(abs(b - a) <= 620.0 * 0.004 for a, b in itertools.pairwise(errors_j))


def test_slow_reads_neither_hide_the_period_nor_widen_every_window() -> None:
    """One read in 20 takes 30 ms (the reading thread was descheduled), also while the clock is learned: the
    period is still learned, and the clock is measured again in a few reads now and then, not at every read."""
    trace, counter = run_h200(30.0, [2.0 + 0.6 * i for i in range(45)], slow_share=0.05, slow_s=0.03)
    assert trace.updates is not None and trace.updates.period_s == pytest.approx(0.10002, rel=1e-3)
    assert trace.relock_reads <= 0.25 * (trace.reads - trace.calibration_reads)
    assert longest_burst(counter, trace.calibration_reads) <= 8


@pytest.mark.parametrize("seed", range(6))
def test_the_update_clock_is_learned_in_a_few_reads_a_period(seed: int) -> None:
    """An H200-like counter (:class:`H200Counter`, one read in five slow here): the clock is searched for with
    a few reads a period, not back to back (which takes a period's worth of reads for every change), and the
    period it finds is the counter's within 0.1%."""
    trace, _ = run_h200(6.0, [], slow_share=0.2, seed=seed)
    assert trace.updates is not None and trace.updates.period_s == pytest.approx(0.10002, rel=1e-3)
    assert trace.calibration_reads <= 40
    figures = trace.figures()
    assert 0.0 < figures["calibration_cpu_s"] <= figures["thread_cpu_s"]
