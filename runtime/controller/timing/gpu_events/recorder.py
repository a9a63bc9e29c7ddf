"""The recorder: what the training threads call at each step boundary (:meth:`EventRecorder.mark`) and anchor
(:meth:`EventRecorder.anchor`): record an event of the board's ring (:mod:`.board`) on the current stream, write
its handle and host time there, count it. The first call records the origin event and starts the poller
(:mod:`.poller`) in that thread's CUDA context.

Each call takes a few microseconds of Python (no lock, no allocation: the events are made once, a ring of
``ANCHOR_SLOTS`` anchors and ``MARK_SLOTS`` marks). Anchors of a step past ``MAX_ANCHORS_PER_STEP``, or recorded
while the GPU is a whole ring of anchors behind, are dropped with the rest of their step (a step's anchors keep
their numbers). Invariants: one thread records at a time (the training loop's, or autograd's while the training
loop waits in ``backward``); the GPU is never ``MARK_SLOTS`` steps behind its host (its launch queue holds far
fewer). :class:`HostRecorder` stands in for ``cpu_test_mode`` (no CUDA): its marks are passed at once.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from kdvfs.runtime.controller.timing.gpu_events.board import (
    ANCHOR_SLOTS,
    ANCHORS,
    ANCHORS_PASSED,
    HOOK_S,
    MARK_SLOTS,
    MARKS,
    MARKS_PASSED,
    NO_SIGNATURE,
    ORIGIN,
    EventBoard,
)
from kdvfs.runtime.controller.timing.gpu_events.driver import EventCalls
from kdvfs.runtime.controller.timing.gpu_events.poller import EventPoller, compile_loop

MAX_ANCHORS_PER_STEP = 4096
CPU_SAMPLE_ANCHORS = 16
"""Every this many anchors one counts its CPU (two ``time.thread_time`` calls, system calls that cost an anchor
several times its own Python), for all of them: the board's ``HOOK_S``."""


def thread_time_cost_s(reads: int = 33) -> float:
    """What two ``time.thread_time`` calls add to the CPU time they measure (s): the median difference of
    ``reads`` back-to-back pairs."""
    differences = []
    for _ in range(reads):
        began_s = time.thread_time()
        differences.append(time.thread_time() - began_s)
    return sorted(differences)[reads // 2]


class EventRecorder:
    """Records marks and anchors on ``board`` (module docstring). ``calls``: the event calls the poller makes;
    ``new_event()``: a timing event (``torch.cuda.Event(enable_timing=True)``); ``stream()``: the calling thread's
    current stream; ``allocations()``: the caching allocator's allocations so far (None: signatures not counted)."""

    def __init__(self, board: EventBoard, calls: EventCalls, new_event: Callable[[], Any],
                 stream: Callable[[], Any], allocations: Callable[[], int] | None) -> None:
        self.board, self._calls, self._stream, self._allocations = board, calls, stream, allocations
        self._loop = compile_loop(calls)
        self._anchor_events = [new_event() for _ in range(ANCHOR_SLOTS)]
        self._mark_events = [new_event() for _ in range(MARK_SLOTS)]
        self._origin = new_event()
        self._started = threading.Lock()
        self._pid = os.getpid()
        self.poller: EventPoller | None = None
        self._previous_allocations: int | None = None
        self._step_anchors = 0
        self._dropping = False
        self._anchors_seen = 0
        self._counting_s = thread_time_cost_s()

    def _start(self) -> None:
        """Record the origin and start the poller, once (the first mark or anchor)."""
        with self._started:
            if self.poller is None:
                self._origin.record(self._stream())
                self.board.ints[ORIGIN] = self._origin.cuda_event
                self.poller = EventPoller(self.board, self._calls, self._calls.current_context(), self._loop)
                self.poller.start()
                atexit.register(self.stop)  # before CUDA's own teardown (registered earlier, run later)

    def mark(self) -> int:
        """Record the end of the current step; its number (from 0)."""
        began_cpu_s = time.thread_time()
        if self.poller is None:
            self._start()
        board = self.board
        step = int(board.ints[MARKS])
        slot = step % MARK_SLOTS
        event = self._mark_events[slot]
        event.record(self._stream())
        board.mark_handle[slot] = event.cuda_event
        board.mark_anchors[slot] = board.ints[ANCHORS]
        board.mark_signature[slot] = self._signature()
        board.ints[MARKS] = step + 1
        self._step_anchors, self._dropping = 0, False
        board.floats[HOOK_S] += time.thread_time() - began_cpu_s
        return step

    def _signature(self) -> int:
        if self._allocations is None:
            return NO_SIGNATURE
        count = self._allocations()
        previous, self._previous_allocations = self._previous_allocations, count
        return NO_SIGNATURE if previous is None else count - previous

    def anchor(self) -> None:
        """Record an anchor of the current step (from a hook)."""
        counted = self._anchors_seen % CPU_SAMPLE_ANCHORS == 0
        self._anchors_seen += 1
        began_cpu_s = time.thread_time() if counted else 0.0
        began_s = time.perf_counter()
        if self.poller is None:
            self._start()
        board = self.board
        number = int(board.ints[ANCHORS])
        self._dropping = (self._dropping or self._step_anchors >= MAX_ANCHORS_PER_STEP
                          or number - board.ints[ANCHORS_PASSED] >= ANCHOR_SLOTS)
        if not self._dropping:
            slot = number % ANCHOR_SLOTS
            event = self._anchor_events[slot]
            event.record(self._stream())
            board.anchor_handle[slot] = event.cuda_event
            board.anchor_hook_s[slot] = began_s
            board.ints[ANCHORS] = number + 1
            self._step_anchors += 1
        if counted:
            board.floats[HOOK_S] += CPU_SAMPLE_ANCHORS * max(0.0, time.thread_time() - began_cpu_s - self._counting_s)

    def stop(self) -> None:
        """Stop the poller (idempotent; nothing in a forked child, whose board may be its parent's)."""
        if self.poller is not None and os.getpid() == self._pid:
            atexit.unregister(self.stop)
            self.poller.stop()


class HostRecorder:
    """CPU test mode (no CUDA): records marks on ``board`` as passed at once, at the host's time (``clock.now_s``,
    offset 0), each step's duration the training thread's CPU time since the previous mark (``cpu_time_s``, default
    ``time.thread_time``, as ``kdvfs capture --cpu-test-mode`` measures it: on a busy machine the wall time of a CPU
    step is mostly the scheduler's, not the step's). No anchors; each mark's CPU goes to ``HOOK_S``."""

    def __init__(self, board: EventBoard, now_s: Callable[[], float],
                 cpu_time_s: Callable[[], float] = time.thread_time) -> None:
        self.board, self._now_s, self._cpu_time_s = board, now_s, cpu_time_s
        self._previous_cpu_s: float | None = None

    def mark(self) -> int:
        began_cpu_s = time.thread_time()
        board = self.board
        step = int(board.ints[MARKS])
        slot = step % MARK_SLOTS
        cpu_s = self._cpu_time_s()
        board.mark_gpu_s[slot] = board.mark_seen_s[slot] = self._now_s()
        board.mark_duration_s[slot] = float("nan") if self._previous_cpu_s is None else cpu_s - self._previous_cpu_s
        self._previous_cpu_s = cpu_s
        board.mark_anchors[slot] = 0
        board.mark_signature[slot] = NO_SIGNATURE
        board.ints[MARKS] = board.ints[MARKS_PASSED] = step + 1
        board.floats[HOOK_S] += time.thread_time() - began_cpu_s
        return step

    def stop(self) -> None:
        """Nothing to stop."""
