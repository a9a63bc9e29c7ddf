"""The controller benchmark's ``probe=`` arms (``benchmarks/timeline_probe.py``): only the controller's step
timeline, its step-end events waited for by blocking on them or by polling them, or not at all."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import ClassVar

import pytest
import torch

from kdvfs.runtime.controller import gpu_timeline

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def probe() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("timeline_probe")
    finally:
        sys.path.remove(str(BENCHMARKS))


class CountingEvent:
    """A step-end event of a fake GPU that has always passed it; counts how it was waited for."""

    made: ClassVar[list[CountingEvent]] = []

    def __init__(self, enable_timing: bool = False, blocking: bool = False) -> None:
        self.synchronized = self.queried = 0
        CountingEvent.made.append(self)

    def record(self, stream: object = None) -> None:
        pass

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
                         [("mark", 0, 0), ("blocking", 1, 1), ("polling", 0, 1)])
def test_each_probe_waits_for_the_step_ends_its_way(probe: ModuleType, fake_cuda: list[CountingEvent], kind: str,
                                                    synchronized: int, queried: int) -> None:
    with probe.TimelineProbe(kind) as arm:
        for _ in range(3):
            arm.step()
    assert len(fake_cuda) == 3 and arm.summary is None
    assert [(e.synchronized, e.queried) for e in fake_cuda] == [(synchronized, queried)] * 3


def test_a_probe_of_another_kind_or_without_a_gpu_is_refused(probe: ModuleType,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit, match="expected one of mark, blocking, polling"):
        probe.TimelineProbe("spin")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    with pytest.raises(SystemExit, match="need a CUDA GPU"):
        probe.TimelineProbe("mark").__enter__()
