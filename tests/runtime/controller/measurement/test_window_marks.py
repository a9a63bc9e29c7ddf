"""Which window edges the energy counter is asked for: every edge of a counted window, and, where marks cost reads
(a paced counter), no edge that the next step opens again (nor, told the next step's mode, one whose next step
changes mode); and what that costs a paced H200-like counter in reads."""

from __future__ import annotations

import pytest

from kdvfs.runtime.controller.config import ControllerConfig, MeasurementConfig
from kdvfs.runtime.controller.event_log import EventLog
from kdvfs.runtime.controller.measurement import accounting
from kdvfs.runtime.testing.fake_gpu import VirtualClock
from tests.runtime.device.test_energy_trace import run_h200

STEP_S = 0.07
POWER_W = 400.0


class MarkingTrace:
    """An energy trace double: records the marks, knows the counter everywhere (``POWER_W`` from time 0); the last
    one made is ``MarkingTrace.made``."""

    made: MarkingTrace | None = None

    def __init__(self, read_j: object, clock: object, read_every_s: float, next_request_s: object = None) -> None:
        self.read_every_s, self.error = read_every_s, None
        self.marks_s: list[float] = []
        MarkingTrace.made = self

    def start(self) -> None: ...

    def mark(self, time_s: float) -> None:
        self.marks_s.append(time_s)

    def covers(self, time_s: float) -> bool:
        return True

    def energy_j(self, time_s: float) -> float:
        return POWER_W * time_s

    def forget_before(self, time_s: float) -> None: ...

    def stop(self) -> None: ...


class Meter:
    def energy_j(self) -> float:
        return 0.0

    def clocks_mhz(self) -> tuple[float, float]:
        return 1980.0, 3201.0


def run(monkeypatch: pytest.MonkeyPatch, read_every_s: float, unmatched: range | set[int] = range(0),
        settle_steps: int = 1, steps: int = 400, next_step: bool = True) -> tuple[accounting.Accounting, MarkingTrace]:
    """``steps`` steps as the issuer drives them: each step controlled as the open slot says, ``unmatched`` not
    matching (and the one after it at auto); ``next_step``: the accounting is told each next step's mode, as the
    issuer tells it."""
    monkeypatch.setattr(accounting, "EnergyTrace", MarkingTrace)
    config = ControllerConfig(policy="plan.json", trace="t", measurement=MeasurementConfig(
        window_steps=5, window_s=0.0, energy_read_every_s=read_every_s))
    books = accounting.Accounting(Meter(), VirtualClock(), config, settle_steps, EventLog(None))
    books.start(STEP_S)
    controlled = False
    for index in range(1, steps):
        matched = index not in unmatched
        books.step(index, STEP_S, (index + 1) * STEP_S, matched, controlled)
        controlled = matched and books.next_controlled
        if next_step:
            books.next_step(controlled)
    trace = MarkingTrace.made
    assert trace is not None
    return books, trace


@pytest.mark.parametrize("settle_steps", [1, 3])
def test_every_counted_window_has_both_edges_marked_and_the_marks_are_fewer(monkeypatch: pytest.MonkeyPatch,
                                                                             settle_steps: int) -> None:
    paced, paced_trace = run(monkeypatch, 1.0, unmatched=range(150, 190), settle_steps=settle_steps)
    every, every_trace = run(monkeypatch, 0.0, unmatched=range(150, 190), settle_steps=settle_steps)
    assert [w.start_s for w in paced.windows] == [w.start_s for w in every.windows]
    for window in paced.windows:
        assert window.start_s in paced_trace.marks_s and window.end_s in paced_trace.marks_s
        assert window.energy_j_per_step == pytest.approx(POWER_W * STEP_S)
    assert set(paced_trace.marks_s) <= set(every_trace.marks_s)
    skipped = len(every_trace.marks_s) - len(paced_trace.marks_s)
    assert skipped >= 38 + 2 * (settle_steps - 1)  # the stretch's and, per change of mode, the settling steps'
    in_stretch = [t for t in paced_trace.marks_s if 152 * STEP_S <= t < 190 * STEP_S]
    assert not in_stretch  # the stretch's first edge only, and the window after it


def test_an_unpaced_counter_is_marked_at_every_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    books, trace = run(monkeypatch, 0.0, unmatched=range(150, 190))
    assert len(trace.marks_s) >= len(books.windows) + 40


MISMATCHES = set(range(7, 400, 11)) | set(range(150, 190))
"""A dry run's stretch of frequent mismatches (one in eleven steps) and one long stretch: most windows that
open are discarded."""


@pytest.mark.parametrize("settle_steps", [1, 2])
def test_told_the_next_steps_mode_no_edge_of_a_window_it_discards_is_marked(monkeypatch: pytest.MonkeyPatch,
                                                                               settle_steps: int) -> None:
    """After a mismatch the next step runs at auto and, back in a B window, the one after it controlled again: each
    change of mode settles and discards the window opened just before. Told the next step's mode, the paced
    accounting marks none of those edges, and still every edge of every counted window (the same windows as an
    unpaced counter's, which is marked at every restart, with the same joules): under half its marks."""
    told, told_trace = run(monkeypatch, 1.0, unmatched=MISMATCHES, settle_steps=settle_steps)
    every, every_trace = run(monkeypatch, 0.0, unmatched=MISMATCHES, settle_steps=settle_steps)
    assert [(w.start_s, w.end_s) for w in told.windows] == [(w.start_s, w.end_s) for w in every.windows]
    assert len(told.windows) >= 20
    for window in told.windows:
        assert window.start_s in told_trace.marks_s and window.end_s in told_trace.marks_s
        assert window.energy_j_per_step == pytest.approx(POWER_W * STEP_S)
    assert set(told_trace.marks_s) <= set(every_trace.marks_s)
    edges = {w.start_s for w in told.windows} | {w.end_s for w in told.windows}
    print(f"{len(told.windows)} windows ({len(edges)} edges): {len(told_trace.marks_s)} marks paced, "
          f"{len(every_trace.marks_s)} unpaced")
    assert len(told_trace.marks_s) <= 0.5 * len(every_trace.marks_s)
    assert len(told_trace.marks_s) <= len(edges) + len(MISMATCHES) // 2


def test_the_marks_of_a_run_of_frequent_mismatches_cost_few_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The marks of :data:`MISMATCHES`' run (70 ms steps, 400 steps, 28 s) on an H200-like paced counter: a pinned
    read count after learning its clock (162; 207 before the accounting was told the next step's mode, when it
    marked 133 edges for these 32 windows, 83 now; 234 for an unpaced run's marks, at every restart); every
    counted window's joules are the counter's within 4 ms of power of the best a reader can (interpolating the
    counter's updates)."""
    reads = {}
    for read_every_s in (1.0, 0.0):
        books, marking = run(monkeypatch, read_every_s, unmatched=MISMATCHES)
        marks_s = [2.0 + m for m in marking.marks_s]  # the counter's clock is learned in the first 2 s
        trace, counter = run_h200(2.0 + 400 * STEP_S + 0.5, marks_s)
        reads[read_every_s] = trace.reads - trace.calibration_reads
        for window in books.windows:
            start_s, end_s = 2.0 + window.start_s, 2.0 + window.end_s
            joules = trace.energy_j(end_s) - trace.energy_j(start_s)  # type: ignore[operator]
            assert joules == pytest.approx(counter.ideal_j(end_s) - counter.ideal_j(start_s), abs=620.0 * 0.004)
    print(f"reads after learning the clock: {reads[1.0]} for the paced marks, {reads[0.0]} for every restart's")
    assert reads[1.0] <= 0.7 * reads[0.0]
    assert reads[1.0] <= 170


def test_a_window_of_one_step_after_a_stretch_has_its_late_opening_edge_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    """With one-step windows the first counted step after a stretch that does not match also closes the window:
    the opening edge held back for the next step's mode is marked before the window closes."""
    monkeypatch.setattr(accounting, "EnergyTrace", MarkingTrace)
    config = ControllerConfig(policy="plan.json", trace="t", measurement=MeasurementConfig(
        window_steps=1, window_s=0.0, energy_read_every_s=1.0))
    books = accounting.Accounting(Meter(), VirtualClock(), config, 1, EventLog(None))
    books.start(STEP_S)
    for index in range(1, 12):
        books.step(index, STEP_S, (index + 1) * STEP_S, index not in {3, 4, 5}, False)
        books.next_step(False)
    trace = MarkingTrace.made
    assert trace is not None and books.windows
    for window in books.windows:
        assert window.start_s in trace.marks_s and window.end_s in trace.marks_s
