"""Which window edges the energy counter is asked for: every edge of a counted window, and, where marks cost reads
(a paced counter), no edge that the next step opens again."""

from __future__ import annotations

import pytest

from kdvfs.runtime.controller.config import ControllerConfig, MeasurementConfig
from kdvfs.runtime.controller.event_log import EventLog
from kdvfs.runtime.controller.measurement import accounting
from kdvfs.runtime.testing.fake_gpu import VirtualClock

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


def run(monkeypatch: pytest.MonkeyPatch, read_every_s: float, unmatched: range = range(0),
        settle_steps: int = 1, steps: int = 400) -> tuple[accounting.Accounting, MarkingTrace]:
    """``steps`` steps as the issuer drives them: each step controlled as the open slot says, ``unmatched`` not
    matching."""
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
