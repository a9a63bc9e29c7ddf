"""Where the GPU is in the training steps: step ends on the host's time base, re-synchronised every step.

The training thread calls :meth:`StepTimeline.mark` at each step boundary (cheap, no GPU sync); the
controller's thread calls :meth:`StepTimeline.wait`, which returns once the GPU has finished that step
(one sleep to ``POLL_S`` before its expected end, then a look every ``POLL_S``, further apart once it is late).
:class:`BoardTimeline` reads the event board (:mod:`kdvfs.runtime.controller.timing.gpu_events`): CUDA events the
training threads record at each boundary and anchor, which a native thread there polls without the interpreter
lock, writing the GPU time each was passed; GPU times become host seconds through the host-minus-GPU offset, the
smallest of the last ``OFFSET_WINDOW`` marks' (a late look does not move the timeline); in ``cpu_test_mode`` the
host's own marks stand in (no anchors). Anchors (:mod:`kdvfs.runtime.controller.timing.anchor_hooks`) recorded after
boundary ``i - 1`` and before boundary ``i`` belong to step ``i`` (0-based): :meth:`StepTimeline.anchor_s` waits for
one (until a deadline; None: not passed by then), :meth:`StepTimeline.passed_anchor` asks without waiting which the
GPU passed last, and :class:`StepEnd` carries a finished step's anchors' host times.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kdvfs.common.errors import KdvfsError
from kdvfs.runtime.controller.timing.gpu_events.board import (
    ANCHOR_SLOTS,
    ANCHORS,
    ANCHORS_PASSED,
    HOOK_S,
    MARK_SLOTS,
    MARKS,
    MARKS_PASSED,
    NO_SIGNATURE,
    POLLER_CPU_S,
    POLLS,
    SERVER_CPU_S,
    EventBoard,
)
from kdvfs.runtime.controller.timing.gpu_events.driver import driver_event_calls
from kdvfs.runtime.controller.timing.gpu_events.recorder import EventRecorder, HostRecorder
from kdvfs.runtime.device.host_time import Clock

OFFSET_WINDOW = 32
STALL_S = 5.0
"""A wait whose item the board's poller has not passed raises once the poller made no poll for this long (s)."""
POLL_S = 0.001
"""How often a waiting thread looks whether the GPU has passed an item, at most (s; :func:`wait_for`)."""
LATE_SHARE = 0.125
MAX_POLL_S = 0.05
"""Past its expected time, a wait looks every ``LATE_SHARE`` of the time it has been late (never more often than
``POLL_S``, never less than ``MAX_POLL_S``): an evaluation pass or a checkpoint between two steps costs a few dozen
looks, not one a millisecond (s; :func:`wait_for`)."""
PACE_QUANTILES = (0.1, 0.7)
""":func:`host_pace_s` averages the gaps between these quantiles: the longest gaps are where the host waited for the
GPU (a synchronisation, a full launch queue) or did the step's own host work, the shortest back-to-back hooks."""
MIN_PACE_GAPS = 4


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


def wait_for(passed: Callable[[], bool], expected_s: float = -math.inf,
             now_s: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep) -> int:
    """Return once ``passed()`` (the GPU has passed an item: a look at the board, the interpreter lock held for
    microseconds): the first look after one sleep to ``POLL_S`` before ``expected_s`` (host s on
    ``now_s``'s time base, when the event is expected; at once when that is past), then one every ``POLL_S`` until
    it is late, and further apart the later it is (``LATE_SHARE`` of the lateness, at most ``MAX_POLL_S``; without
    an expected time, late from the wait's start). Returns the sleeps. In the training process each look takes the
    interpreter lock from a launch-bound training thread (``docs/design/controller.md``), so the wait makes as few
    as it can: an item passed well before ``expected_s`` is seen up to that much after, one passed late at most
    ``LATE_SHARE`` of its lateness after (its time is the GPU's own, not the look's)."""
    sleeps, late_from_s = 0, max(expected_s, now_s())
    while not passed():
        now = now_s()
        sleep(max(POLL_S, expected_s - POLL_S - now) if now < late_from_s
              else min(MAX_POLL_S, max(POLL_S, LATE_SHARE * (now - late_from_s))))
        sleeps += 1
    return sleeps


def allocations() -> int:
    """Allocations the CUDA caching allocator has served in this process."""
    import torch

    return int(torch.cuda.memory_stats_as_nested_dict()["allocation"]["all"]["allocated"])


class TimelineError(KdvfsError):
    """The board cannot say where the GPU is: a step's record was reused before the controller read it, or the
    poller stopped."""


class BoardTimeline:
    """Step ends and anchors read from an event board (:mod:`kdvfs.runtime.controller.timing.gpu_events.board`) on
    ``clock`` (with CUDA the real one: the board's host times are ``time.perf_counter``'s). With ``recorder`` (this
    process's: :class:`~kdvfs.runtime.controller.timing.gpu_events.recorder.EventRecorder`, or ``HostRecorder`` in
    ``cpu_test_mode``) :meth:`mark` records the step's end; without (a controller in a process of its own, reading
    the training process's board) it numbers the steps that process announced.

    The waits (:meth:`wait`, :meth:`anchor_s`) look at the board's counts (:func:`wait_for`), never at an event:
    the poller thread there asked the GPU. A host time is the item's GPU time plus the host-minus-GPU offset, the
    smallest of the last ``OFFSET_WINDOW`` marks' (the host time the poller saw each passed, minus its GPU time; a
    late look does not move the timeline). Raises :class:`TimelineError` for a step whose record the ring reused (a
    controller ``MARK_SLOTS`` steps behind), and in a wait once the board's polls stood still for ``STALL_S`` (the
    poller stopped: its process ended, or it was stopped).
    """

    def __init__(self, board: EventBoard, clock: Clock, recorder: EventRecorder | HostRecorder | None = None) -> None:
        self.board, self._clock, self.recorder = board, clock, recorder
        self._marks = 0
        self._offset: tuple[int, float | None] = (0, None)
        self.sleeps = 0
        """Sleeps of the waiting thread (:func:`wait_for`) in :meth:`wait` and :meth:`anchor_s`."""

    @property
    def hook_s(self) -> float:
        """The recorder's CPU on the training threads (s, its marks' and sampled anchors')."""
        return float(self.board.floats[HOOK_S])

    @property
    def server_cpu_s(self) -> float:
        """The CPU of the training process's threads that serve the controller: the poller and the shape server
        (s)."""
        return float(self.board.floats[POLLER_CPU_S] + self.board.floats[SERVER_CPU_S])

    def mark(self) -> int:
        if self.recorder is not None:
            return self.recorder.mark()
        step = self._marks
        self._marks += 1
        return step

    def stop(self) -> None:
        """Stop this process's poller (none: nothing; idempotent)."""
        if self.recorder is not None:
            self.recorder.stop()

    def _offset_s(self) -> float | None:
        passed = int(self.board.ints[MARKS_PASSED])
        if passed != self._offset[0]:
            slots = np.arange(max(0, passed - OFFSET_WINDOW), passed) % MARK_SLOTS
            self._offset = (passed, float(np.min(self.board.mark_seen_s[slots] - self.board.mark_gpu_s[slots])))
        return self._offset[1]

    def _first_anchor(self, step: int) -> int:
        """The number of step ``step``'s first anchor (its previous mark is recorded)."""
        return 0 if step == 0 else int(self.board.mark_anchors[(step - 1) % MARK_SLOTS])

    def _recorded_end(self, step: int, anchors: int, marks: int) -> int:
        """One past the number of step ``step``'s last anchor recorded, from the board's anchor count ``anchors`` read
        before its mark count ``marks`` (>= ``step``): a step not yet ended when the marks were read holds every anchor
        counted before."""
        return int(self.board.mark_anchors[step % MARK_SLOTS]) if marks > step else anchors

    def _check(self, step: int) -> None:
        if int(self.board.ints[MARKS]) - step >= MARK_SLOTS:
            raise TimelineError(f"step {step}'s record was reused: the controller fell {MARK_SLOTS} steps "
                                "behind the training loop")

    def _watched(self, passed: Callable[[], bool]) -> Callable[[], bool]:
        """``passed``, raising :class:`TimelineError` once it has been false while the board's polls stood still for
        ``STALL_S``."""
        board, now_s = self.board, self._clock.now_s
        last = [int(board.ints[POLLS]), now_s()]

        def watched() -> bool:
            if passed():
                return True
            polls, at_s = int(board.ints[POLLS]), now_s()
            if polls != last[0]:
                last[:] = [polls, at_s]
            elif at_s - last[1] > STALL_S:
                raise TimelineError(f"the event poller made no poll in {STALL_S:.0f} s: it stopped")
            return False

        return watched

    def wait(self, token: int, expected_s: float = -math.inf) -> StepEnd:
        board, step = self.board, token
        self.sleeps += wait_for(self._watched(lambda: board.ints[MARKS_PASSED] > step), expected_s, self._clock.now_s)
        self._check(max(step - 1, 0))  # its anchors' first number is on the previous mark
        slot = step % MARK_SLOTS
        offset_s = self._offset_s() or 0.0
        gpu_s = float(board.mark_gpu_s[slot])
        first, end = self._first_anchor(step), int(board.mark_anchors[slot])
        slots = np.arange(first, end if int(board.ints[ANCHORS]) - first <= ANCHOR_SLOTS else first) % ANCHOR_SLOTS
        signature, duration_s = int(board.mark_signature[slot]), float(board.mark_duration_s[slot])
        return StepEnd(gpu_s + offset_s, None if math.isnan(duration_s) else duration_s,
                       None if signature == NO_SIGNATURE else signature,
                       tuple((board.anchor_gpu_s[slots] + offset_s).tolist()),
                       host_pace_s(board.anchor_hook_s[slots].tolist()))

    def anchor_s(self, step: int, index: int, deadline_s: float) -> float | None:
        board = self.board
        while True:
            anchors, marks = int(board.ints[ANCHORS]), int(board.ints[MARKS])  # in this order (_recorded_end)
            if marks >= step:
                number = self._first_anchor(step) + index
                if number < self._recorded_end(step, anchors, marks):
                    break
                if marks > step:
                    return None  # the step ended without it
            if self._clock.now_s() >= deadline_s:
                return None
            time.sleep(POLL_S)  # anchors do not notify: poll
            self.sleeps += 1
        self._check(step)
        self.sleeps += wait_for(self._watched(lambda: board.ints[ANCHORS_PASSED] > number), now_s=self._clock.now_s)
        offset_s = self._offset_s()
        return None if offset_s is None else float(board.anchor_gpu_s[number % ANCHOR_SLOTS]) + offset_s

    def passed_anchor(self, step: int, after: int) -> tuple[int, float] | None:
        board = self.board
        anchors, marks = int(board.ints[ANCHORS]), int(board.ints[MARKS])  # in this order (_recorded_end)
        if marks < step:
            return None
        first = self._first_anchor(step)
        latest = min(int(board.ints[ANCHORS_PASSED]), self._recorded_end(step, anchors, marks)) - 1 - first
        offset_s = self._offset_s()
        if latest <= after or offset_s is None:
            return None
        self._check(step)
        return latest, float(board.anchor_gpu_s[(first + latest) % ANCHOR_SLOTS]) + offset_s


def local_timeline(clock: Clock, cpu_test_mode: bool, board: EventBoard | None = None) -> BoardTimeline:
    """This process's timeline recorded on ``board`` (None: a board of its own; a shared one for a controller in a
    process of its own): from CUDA events on the current stream, polled with the CUDA driver's calls, or the
    host's own marks in ``cpu_test_mode``."""
    board = board or EventBoard.local()
    if cpu_test_mode:
        return BoardTimeline(board, clock, HostRecorder(board, clock.now_s))
    import torch

    recorder = EventRecorder(board, driver_event_calls(), lambda: torch.cuda.Event(enable_timing=True),
                             current_stream, allocations)
    return BoardTimeline(board, clock, recorder)
