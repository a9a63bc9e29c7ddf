"""The controller benchmark's ``probe=`` arms (``benchmarks/timeline_probe.py``): only the controller's step
timeline, its step-end events waited for by blocking on them or by polling them, or not at all."""

from __future__ import annotations

from types import ModuleType
from typing import ClassVar

import pytest
import torch

from kdvfs.runtime.controller.timing import gpu_timeline
from tests.benchmarks.scripts import script_module


@pytest.fixture(scope="module")
def probe() -> ModuleType:
    return script_module("timeline_probe")


class CountingEvent:
    """A step-end event of a fake GPU that has always passed it; counts how it was waited for."""

    made: ClassVar[list[CountingEvent]] = []

    def __init__(self, enable_timing: bool = False, blocking: bool = False) -> None:
        self.synchronized = self.queried = self.recorded = 0
        CountingEvent.made.append(self)

    def record(self, stream: object = None) -> None:
        self.recorded += 1

    def synchronize(self) -> None:
        self.synchronized += 1

    def query(self) -> bool:
        self.queried += 1
        return True

    def elapsed_time(self, other: CountingEvent) -> float:
        return 0.0


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[CountingEvent]:
    CountingEvent.made = []
    monkeypatch.setattr(torch.cuda, "Event", CountingEvent)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(gpu_timeline, "current_stream", lambda: None)
    monkeypatch.setattr(gpu_timeline, "_allocations", lambda: 0)
    return CountingEvent.made


@pytest.mark.parametrize(("kind", "synchronized", "queried"),
                         [("mark", 0, 0), ("blocking", 1, 1), ("polling", 0, 1), ("anchors", 0, 1)])
def test_each_probe_waits_for_the_step_ends_its_way(probe: ModuleType, fake_cuda: list[CountingEvent], kind: str,
                                                    synchronized: int, queried: int) -> None:
    with probe.TimelineProbe(kind) as arm:
        for _ in range(3):
            arm.step()
    assert len(fake_cuda) == 3 and arm.summary is None
    assert [(e.synchronized, e.queried) for e in fake_cuda] == [(synchronized, queried)] * 3


def test_a_probe_of_another_kind_or_without_a_gpu_is_refused(probe: ModuleType,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for kind in ("spin", "gil:25", "gil:x200", "gil:2.5x200"):
        with pytest.raises(SystemExit, match="expected one of mark, blocking, polling, anchors, gil:WAKESxUS"):
            probe.TimelineProbe(kind)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    with pytest.raises(SystemExit, match="need a CUDA GPU"):
        probe.TimelineProbe("mark").__enter__()


def test_an_anchors_probe_records_the_controllers_anchors_into_its_timeline(
        probe: ModuleType, fake_cuda: list[CountingEvent]) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with probe.TimelineProbe("anchors") as arm:
        for _ in range(2):
            model(torch.ones(1, 4, requires_grad=True)).sum().backward()
            arm.step()
    assert arm.hooks.blocks == 2
    # Per step: its two blocks' forward and backward anchors, then the step's own event (anchors' events are
    # pooled and recorded again once the GPU has passed them).
    assert sum(e.recorded for e in fake_cuda) == 2 * (2 + 2 + 1)
    assert not arm.hooks._handles  # removed on exit


def test_a_gil_probe_polls_and_holds_the_lock_its_wakes_times_through_a_step(
        probe: ModuleType, fake_cuda: list[CountingEvent], monkeypatch: pytest.MonkeyPatch) -> None:
    arm = probe.TimelineProbe("gil:3x2000")
    assert (arm.wakes, arm.hold_s) == (3, 0.002)
    sleeps: list[float] = []
    monkeypatch.setattr(probe.time, "sleep", sleeps.append)
    began_s = probe.time.perf_counter()
    arm._hold_through(began_s, 0.004)  # wakes due 1, 2 and 3 ms after the step's end
    assert probe.time.perf_counter() - began_s >= 3 * 0.002  # each hold runs its whole time
    assert len(sleeps) == 3 and sleeps[0] > 0 and sleeps[1:] == [0.0, 0.0]  # the holds outlast the gaps
    with arm:
        for _ in range(2):
            arm.step()
    assert [e.queried for e in fake_cuda] == [1, 1]  # it polls as ``polling`` does
