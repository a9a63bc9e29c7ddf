"""Where the GPU is in the training steps: step ends on the host's time base, re-synchronised every step.

At every step boundary the training thread calls :meth:`StepTimeline.mark` (cheap, no GPU sync); the
controller's thread calls :meth:`StepTimeline.wait`, which returns once the GPU has finished that step.

:class:`CudaStepTimeline` records a CUDA event per boundary. The GPU time of a step end is the event's
time since the first one (``Event.elapsed_time``, microsecond resolution); it becomes host time through
the offset host-minus-GPU, estimated at every step as the smallest (waking from ``Event.synchronize`` is
only ever late) of the last ``OFFSET_WINDOW`` observations. So a late wake-up (a busy interpreter lock)
does not move the timeline, and clock drift is followed within a window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from runtime.device.clock import Clock, VirtualClock
from runtime.device.fake import FakeGpu

OFFSET_WINDOW = 32
NORMAL_SIGNATURE = 1000


@dataclass(frozen=True)
class StepEnd:
    """A finished step: host time its GPU work ended (s), its GPU time since the previous step's end (s, None
    for the first), and its allocation count (None when not counted)."""

    end_s: float
    duration_s: float | None
    signature: int | None


class StepTimeline(Protocol):
    def mark(self) -> Any: ...

    def wait(self, token: Any) -> StepEnd: ...


def _allocations() -> int:
    """Allocations the CUDA caching allocator has served in this process."""
    import torch

    return int(torch.cuda.memory_stats_as_nested_dict()["allocation"]["all"]["allocated"])


class CudaStepTimeline:
    """Step ends from CUDA events on the current stream (see the module docstring)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._first: Any = None
        self._offsets_s: deque[float] = deque(maxlen=OFFSET_WINDOW)
        self._previous_gpu_s: float | None = None
        self._allocations: int | None = None

    def mark(self) -> tuple[Any, int | None]:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        if self._first is None:
            self._first = event
        count = _allocations()
        signature = None if self._allocations is None else count - self._allocations
        self._allocations = count
        return event, signature

    def wait(self, token: tuple[Any, int | None]) -> StepEnd:
        event, signature = token
        event.synchronize()
        wake_s = self._clock.now_s()
        gpu_s = self._first.elapsed_time(event) / 1e3
        self._offsets_s.append(wake_s - gpu_s)
        duration_s = None if self._previous_gpu_s is None else gpu_s - self._previous_gpu_s
        self._previous_gpu_s = gpu_s
        return StepEnd(gpu_s + min(self._offsets_s), duration_s, signature)


class HostStepTimeline:
    """Host time at each boundary stands in for the GPU's (CPU test mode: no CUDA)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._previous_s: float | None = None

    def mark(self) -> float:
        return self._clock.now_s()

    def wait(self, token: float) -> StepEnd:
        duration_s = None if self._previous_s is None else token - self._previous_s
        self._previous_s = token
        return StepEnd(token, duration_s, None)


class FakeStepTimeline:
    """Steps of a :class:`FakeGpu`: each runs when the controller waits for it, after the requests made so far.

    ``irregular[i] = (extra_s, signature)`` makes step ``i`` (0-based) take ``extra_s`` longer and count
    ``signature`` allocations (an evaluation pass); other steps count ``NORMAL_SIGNATURE``.
    """

    def __init__(self, gpu: FakeGpu, clock: VirtualClock) -> None:
        self.gpu, self.clock = gpu, clock
        self.irregular: dict[int, tuple[float, int]] = {}
        self._marked = 0

    def mark(self) -> tuple[float, int]:
        extra_s, signature = self.irregular.get(self._marked, (0.0, NORMAL_SIGNATURE))
        self._marked += 1
        return extra_s, signature

    def wait(self, token: tuple[float, int]) -> StepEnd:
        extra_s, signature = token
        step = self.gpu.run_step(extra_s)
        return StepEnd(step.end_s, step.end_s - step.start_s, signature)
