"""Where the GPU is in the training steps: step ends on the host's time base, re-synchronised every step.

The training thread calls :meth:`StepTimeline.mark` at each step boundary (cheap, no GPU sync); the
controller's thread calls :meth:`StepTimeline.wait`, which returns once the GPU has finished that step
(one sleep to ``POLL_S`` before its expected end, then a look every ``POLL_S``, further apart once it is late).
:class:`CudaStepTimeline` records a CUDA event per boundary and turns GPU times into host seconds through the
host-minus-GPU offset, the smallest of the last ``OFFSET_WINDOW`` observations (a late wake-up does not move
the timeline); :class:`HostStepTimeline` is the host's own, for ``cpu_test_mode``. Anchors
(:mod:`kdvfs.runtime.controller.timing.anchor_hooks`) recorded after boundary ``i - 1`` and before boundary
``i`` belong to step ``i`` (0-based): :meth:`StepTimeline.anchor_s` waits for one (until a deadline; None:
not passed by then), :meth:`StepTimeline.passed_anchor` asks without waiting which the GPU passed last, and
:class:`StepEnd` carries a finished step's anchors' host times.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kdvfs.runtime.device.host_time import Clock

OFFSET_WINDOW = 32
POLL_S = 0.001
"""How often a waiting thread asks an event whether the GPU has passed it, at most (s; :func:`wait_for`)."""
LATE_SHARE = 0.125
MAX_POLL_S = 0.05
"""Past its expected time, a wait looks every ``LATE_SHARE`` of the time it has been late (never more often than
``POLL_S``, never less than ``MAX_POLL_S``): an evaluation pass or a checkpoint between two steps costs a few dozen
looks, not one a millisecond (s; :func:`wait_for`)."""
MAX_ANCHORS_PER_STEP = 4096
CPU_SAMPLE_ANCHORS = 16
"""Every this many anchors one counts its CPU (two ``time.thread_time`` calls, system calls that cost an anchor
several times its own Python), for all of them: ``CudaStepTimeline.hook_s``."""
KEEP_STEPS = 64
PACE_QUANTILES = (0.1, 0.7)
""":func:`host_pace_s` averages the gaps between these quantiles: the longest gaps are where the host waited for the
GPU (a synchronisation, a full launch queue) or did the step's own host work, the shortest back-to-back hooks."""
MIN_PACE_GAPS = 4


def thread_time_cost_s(reads: int = 33) -> float:
    """What two ``time.thread_time`` calls add to the CPU time they measure (s): the median difference of
    ``reads`` back-to-back pairs."""
    differences = []
    for _ in range(reads):
        began_s = time.thread_time()
        differences.append(time.thread_time() - began_s)
    return sorted(differences)[reads // 2]


def host_pace_s(times_s: Sequence[float]) -> float | None:
    """The host's pace through a step: the mean of the gaps between consecutive anchor hooks' host times
    (``times_s``, s, in the order the hooks ran) from the ``PACE_QUANTILES`` quantiles' ranks (s); None with fewer
    than ``MIN_PACE_GAPS`` gaps. A gap where the host only launches a block's kernels does not depend on the GPU's
    clocks (the GPU runs them later); where it waits for the GPU it does, and such gaps are the longest ones
    a step has (docs/design/controller.md)."""
    gaps = sorted(b - a for a, b in itertools.pairwise(times_s))
    if len(gaps) < MIN_PACE_GAPS:
        return None
    low, high = (int(q * (len(gaps) - 1)) for q in PACE_QUANTILES)
    kept = gaps[low:high + 1]
    return math.fsum(kept) / len(kept)


@dataclass(frozen=True)
class StepEnd:
    """A finished step: host time its GPU work ended (s), its GPU time since the previous step's end (s, None
    for the first), its allocation count (None when not counted), the host times at which the GPU passed its
    anchors (s) and the host's pace through it (:func:`host_pace_s` of its hooks' own host times, s; None: not
    known)."""

    end_s: float
    duration_s: float | None
    signature: int | None
    anchors_s: tuple[float, ...] = ()
    host_pace_s: float | None = None


class StepTimeline(Protocol):
    def mark(self) -> Any: ...

    def wait(self, token: Any, expected_s: float = -math.inf) -> StepEnd:
        """The step end of ``token`` (a :meth:`mark`), once the GPU has finished that step; ``expected_s``: when
        it is expected to (host s), where the wait may sleep towards it."""

    def anchor_s(self, step: int, index: int, deadline_s: float) -> float | None:
        """Host time at which the GPU passed anchor ``index`` of step ``step`` (waiting for it), or None when
        the training thread had not recorded it by ``deadline_s`` (host s) or ended the step without it."""

    def passed_anchor(self, step: int, after: int) -> tuple[int, float] | None:
        """The last anchor of step ``step`` after anchor ``after`` (-1: from the first) that the GPU has passed,
        as (index, host time s), or None if none has been passed since; never waits."""


_STREAMS: dict[tuple[int, int, int], Any] = {}


def current_stream() -> Any:
    """``torch.cuda.current_stream()`` (the calling thread's), its Python object made once per stream: a new
    one at every call costs most of an anchor's CPU. Threads may race to make a stream's first object: one is
    kept, and either records on the same stream."""
    import torch

    if not torch.cuda.is_initialized():
        return torch.cuda.current_stream()
    key = torch._C._cuda_getCurrentStream(torch._C._cuda_getDevice())
    stream = _STREAMS.get(key)
    if stream is None:
        stream = _STREAMS[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
    return stream


def wait_for(event: Any, expected_s: float = -math.inf, now_s: Callable[[], float] = time.perf_counter,
             sleep: Callable[[float], None] = time.sleep) -> int:
    """Return once the GPU has passed ``event``, asked at each look (``Event.query``: no sync, the interpreter
    lock held for microseconds): the first look after one sleep to ``POLL_S`` before ``expected_s`` (host s on
    ``now_s``'s time base, when the event is expected; at once when that is past), then one every ``POLL_S`` until
    it is late, and further apart the later it is (``LATE_SHARE`` of the lateness, at most ``MAX_POLL_S``; without
    an expected time, late from the wait's start). Returns the sleeps. Each look takes the interpreter lock from a
    launch-bound training thread, which costs it far more than the look (``docs/design/controller.md``), so the wait
    makes as few as it can: an event passed well before ``expected_s`` is seen up to that much after, one passed
    late at most ``LATE_SHARE`` of its lateness after (its time is the event's own, not the look's). Not
    ``Event.synchronize``: a thread blocked in it on a blocking-sync event slows a launch-bound training step
    (``docs/results.md``); a spinning sync costs a core."""
    sleeps, late_from_s = 0, max(expected_s, now_s())
    while not event.query():
        now = now_s()
        sleep(max(POLL_S, expected_s - POLL_S - now) if now < late_from_s
              else min(MAX_POLL_S, max(POLL_S, LATE_SHARE * (now - late_from_s))))
        sleeps += 1
    return sleeps


def _allocations() -> int:
    """Allocations the CUDA caching allocator has served in this process."""
    import torch

    return int(torch.cuda.memory_stats_as_nested_dict()["allocation"]["all"]["allocated"])


class CudaStepTimeline:
    """Step ends and anchors from CUDA events on the current stream (docs/design/controller.md).

    :meth:`mark` is called on the training thread, :meth:`anchor` on the training thread or autograd's,
    :meth:`wait` and :meth:`anchor_s` on the controller's thread, which polls the events (:func:`wait_for`): it
    neither spins a core (which slows a launch-bound training loop) nor blocks in the driver. Anchor events
    are recorded again once their step is done (a pool), so no CUDA event is created and destroyed per anchor
    on the training thread.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._first: Any = None
        self._offsets_s: deque[float] = deque(maxlen=OFFSET_WINDOW)
        self._offset_s = 0.0
        """Host minus GPU time (s): the least of ``_offsets_s`` (set with each; read only once there is one)."""
        self._previous_gpu_s: float | None = None
        self._allocations: int | None = None
        self._anchors: dict[int, list[tuple[Any, float]]] = {}
        """The anchors of each marked step (until :meth:`wait` takes them): each its event and the host time its
        hook ran (s)."""
        self._recording: list[tuple[Any, float]] = []
        """The anchors of the step being recorded (the ``_marks``-th): :meth:`mark` moves it to ``_anchors``."""
        self._marks = 0
        self._changed = threading.Condition()
        self._pool: list[Any] = []
        self.hook_s = 0.0
        """CPU time spent in :meth:`mark` and :meth:`anchor`, on the threads that call them (s, each thread's
        ``time.thread_time``: not the time a hook waits for the interpreter lock, which another thread holds): every
        mark's, and every ``CPU_SAMPLE_ANCHORS``-th anchor's times ``CPU_SAMPLE_ANCHORS`` (an estimate; concurrent
        anchors from autograd's threads may drop an addition), less what the counting itself adds."""
        self._anchors_seen = 0
        self._counting_s = thread_time_cost_s()
        self.sleeps = 0
        """Sleeps of the waiting thread (:func:`wait_for`) in :meth:`wait` and :meth:`anchor_s`."""

    def mark(self) -> tuple[Any, int | None, int]:
        import torch

        began_cpu_s = time.thread_time()
        event = torch.cuda.Event(enable_timing=True, blocking=True)
        event.record(current_stream())
        if self._first is None:
            self._first = event
        count = _allocations()
        signature = None if self._allocations is None else count - self._allocations
        self._allocations = count
        with self._changed:
            step = self._marks
            self._anchors[step], self._recording = self._recording, []
            self._marks += 1
            self._pool += [event for event, _ in self._anchors.pop(step - KEEP_STEPS, [])]  # a waiter that stopped
            self._changed.notify_all()
        self.hook_s += time.thread_time() - began_cpu_s
        return event, signature, step

    def anchor(self) -> None:
        """Record an anchor event of the current step (from a hook; a few microseconds). No lock: a pool's
        ``pop`` and a list's ``append`` are atomic, and an anchor whose list :meth:`mark` moves meanwhile
        was recorded before that mark's event, so it belongs to the step it ends (the sampling count may lose
        an increment to a concurrent anchor: a sample a little off its place)."""
        counted = self._anchors_seen % CPU_SAMPLE_ANCHORS == 0
        self._anchors_seen += 1
        began_cpu_s = time.thread_time() if counted else 0.0
        began_s = time.perf_counter()
        try:
            event = self._pool.pop()
        except IndexError:
            import torch

            event = torch.cuda.Event(enable_timing=True, blocking=True)
        event.record(current_stream())
        events = self._recording
        if len(events) < MAX_ANCHORS_PER_STEP:
            events.append((event, began_s))
        if counted:
            self.hook_s += CPU_SAMPLE_ANCHORS * max(0.0, time.thread_time() - began_cpu_s - self._counting_s)

    def _host_s(self, event: Any) -> float:
        return self._first.elapsed_time(event) / 1e3 + self._offset_s

    def wait(self, token: tuple[Any, int | None, int], expected_s: float = -math.inf) -> StepEnd:
        event, signature, step = token
        self.sleeps += wait_for(event, expected_s, self._clock.now_s)
        wake_s = self._clock.now_s()
        gpu_s = self._first.elapsed_time(event) / 1e3
        self._offsets_s.append(wake_s - gpu_s)
        self._offset_s = min(self._offsets_s)
        duration_s = None if self._previous_gpu_s is None else gpu_s - self._previous_gpu_s
        self._previous_gpu_s = gpu_s
        with self._changed:
            anchors = self._anchors.pop(step, [])
        anchors_s = tuple(self._host_s(event) for event, _ in anchors)
        with self._changed:
            self._pool += [event for event, _ in anchors]  # the GPU has passed them: they can be recorded again
        return StepEnd(gpu_s + self._offset_s, duration_s, signature, anchors_s,
                       host_pace_s([hooked_s for _, hooked_s in anchors]))

    def anchor_s(self, step: int, index: int, deadline_s: float) -> float | None:
        with self._changed:
            while len(self._events_of(step)) <= index and self._marks <= step:  # anchors do not notify: poll
                left_s = deadline_s - self._clock.now_s()
                if left_s <= 0:
                    break
                self._changed.wait(min(left_s, POLL_S))
                self.sleeps += 1
            events = self._events_of(step)
            if len(events) <= index or self._first is None or not self._offsets_s:
                return None
            event = events[index][0]
        self.sleeps += wait_for(event, now_s=self._clock.now_s)
        return self._host_s(event)

    def _events_of(self, step: int) -> list[tuple[Any, float]]:
        """The anchors of step ``step`` recorded so far (the caller holds ``_changed``)."""
        return self._recording if step == self._marks else self._anchors.get(step, [])

    def passed_anchor(self, step: int, after: int) -> tuple[int, float] | None:
        with self._changed:
            events = list(self._events_of(step))
        if self._first is None or not self._offsets_s:
            return None
        latest = None
        for index in range(after + 1, len(events)):
            if not events[index][0].query():  # a few microseconds, no sync; anchors complete in order
                break
            latest = index
        return None if latest is None else (latest, self._host_s(events[latest][0]))


class HostStepTimeline:
    """CPU test mode (no CUDA): host time at each boundary stands in for the GPU's step end, and the training
    thread's CPU time between boundaries for the step's GPU time (``cpu_time_s``, default
    ``time.thread_time``), as ``kdvfs capture --cpu-test-mode`` measures it: on a busy machine the wall time
    of a CPU step is mostly the scheduler's, not the step's."""

    def __init__(self, clock: Clock, cpu_time_s: Callable[[], float] = time.thread_time) -> None:
        self._clock, self._cpu_time_s = clock, cpu_time_s
        self._previous_s: float | None = None

    def mark(self) -> tuple[float, float]:
        return self._clock.now_s(), self._cpu_time_s()

    def wait(self, token: tuple[float, float], expected_s: float = -math.inf) -> StepEnd:
        end_s, cpu_s = token
        duration_s = None if self._previous_s is None else cpu_s - self._previous_s
        self._previous_s = cpu_s
        return StepEnd(end_s, duration_s, None)

    def anchor_s(self, step: int, index: int, deadline_s: float) -> float | None:
        return None

    def passed_anchor(self, step: int, after: int) -> tuple[int, float] | None:
        return None
