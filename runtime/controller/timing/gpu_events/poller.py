"""The poller: a native thread in the training process that writes on the board (:mod:`.board`) when the GPU passed
each mark and anchor, without the interpreter lock.

Its loop is numba ``nopython`` code compiled ``nogil`` over the event calls (:mod:`.driver`): every ``POLL_S`` it
takes the board's items in stream order (a step's anchors, then its mark), asks the next one's event whether the GPU
passed it and, while it has, writes its GPU time (since the origin event, in float64: each from the
previous mark's, so ``cuEventElapsedTime``'s float milliseconds never span more than a step) and, for a mark, the
host time it saw it (``CLOCK_MONOTONIC``: ``time.perf_counter``'s base on Linux), then counts it. Between polls it
sleeps in ``nanosleep``; it never holds the interpreter lock, so a launch-bound training loop does not wait for it.
Its CPU time (``CLOCK_THREAD_CPUTIME_ID``) goes to the board at each poll.

Invariants: items are passed in the order they were counted (a later item is not asked about before an earlier
one passed: anchors recorded on another stream wait for the ones before them); the loop ends at the board's
``STOP``. Failure mode: an event call that fails (an error other than not ready) leaves the item unpassed; the
readers' waits then end at their deadlines.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from kdvfs.runtime.controller.timing.gpu_events.board import (
    ANCHOR_SLOTS,
    ANCHORS,
    ANCHORS_PASSED,
    MARK_SLOTS,
    MARKS,
    MARKS_PASSED,
    ORIGIN,
    POLLER_CPU_S,
    POLLS,
    STOP,
    EventBoard,
)
from kdvfs.runtime.controller.timing.gpu_events.driver import CUDA_SUCCESS, EventCalls, pointer

POLL_S = 0.001
CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID = 1, 3
_libc = ctypes.CDLL(None)
_CLOCK = pointer(ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p), _libc.clock_gettime)
_SLEEP = pointer(ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p), _libc.nanosleep)
_SIGNATURE = ("int64(int64[:], float64[:], uint64[:], float64[:], uint64[:], int64[:], float64[:], float64[:], "
              "float64[:], float32[:], int64[:], int64[:])")


@functools.cache
def compile_loop(calls: EventCalls) -> Callable[..., int]:
    """The poller's loop over ``calls``, compiled once per calls (about a second): its arguments the board's arrays
    and scratch (:meth:`EventPoller.run`); it returns the polls it made."""
    query, elapsed, clock, sleep = calls.query, calls.elapsed, _CLOCK, _SLEEP

    @numba.njit(_SIGNATURE, nogil=True)
    def loop(ints: Any, floats: Any, anchor_handle: Any, anchor_gpu_s: Any, mark_handle: Any, mark_anchors: Any,
             mark_gpu_s: Any, mark_seen_s: Any, mark_duration_s: Any, ms: Any, now: Any,
             pause: Any) -> int:  # pragma: no cover (native code)
        polls = 0
        while ints[STOP] == 0:
            origin = ints[ORIGIN]
            passed, marks_passed = ints[ANCHORS_PASSED], ints[MARKS_PASSED]
            while origin != 0:
                base = origin if marks_passed == 0 else mark_handle[(marks_passed - 1) % MARK_SLOTS]
                base_s = 0.0 if marks_passed == 0 else mark_gpu_s[(marks_passed - 1) % MARK_SLOTS]
                if marks_passed < ints[MARKS] and mark_anchors[marks_passed % MARK_SLOTS] <= passed:
                    slot = marks_passed % MARK_SLOTS
                    if query(mark_handle[slot]) != CUDA_SUCCESS:
                        break
                    clock(CLOCK_MONOTONIC, now.ctypes.data)
                    mark_seen_s[slot] = now[0] + 1e-9 * now[1]
                    elapsed(ms.ctypes.data, base, mark_handle[slot])
                    mark_gpu_s[slot] = base_s + 1e-3 * ms[0]
                    mark_duration_s[slot] = np.nan if marks_passed == 0 else 1e-3 * ms[0]
                    marks_passed += 1
                    ints[MARKS_PASSED] = marks_passed
                elif passed < ints[ANCHORS]:
                    slot = passed % ANCHOR_SLOTS
                    if query(anchor_handle[slot]) != CUDA_SUCCESS:
                        break
                    elapsed(ms.ctypes.data, base, anchor_handle[slot])
                    anchor_gpu_s[slot] = base_s + 1e-3 * ms[0]
                    passed += 1
                    ints[ANCHORS_PASSED] = passed
                else:
                    break
            clock(CLOCK_THREAD_CPUTIME_ID, now.ctypes.data)
            floats[POLLER_CPU_S] = now[0] + 1e-9 * now[1]
            polls += 1
            ints[POLLS] = polls
            sleep(pause.ctypes.data, 0)
        return polls

    return loop


class EventPoller(threading.Thread):
    """The poller's thread on ``board`` with ``calls``, in the CUDA context ``context`` (a handle from
    ``calls.current_context()`` on the training thread); :meth:`stop` ends it."""

    def __init__(self, board: EventBoard, calls: EventCalls, context: int,
                 loop: Callable[..., int] | None = None) -> None:
        super().__init__(name="kdvfs-events", daemon=True)
        self.board, self.calls, self.context = board, calls, context
        self._loop = loop or compile_loop(calls)

    def run(self) -> None:
        board = self.board
        self.calls.set_context(self.context)
        pause = np.array([0, int(POLL_S * 1e9)], dtype=np.int64)
        self._loop(board.ints, board.floats, board.anchor_handle, board.anchor_gpu_s, board.mark_handle,
                   board.mark_anchors, board.mark_gpu_s, board.mark_seen_s, board.mark_duration_s,
                   np.zeros(1, dtype=np.float32),
                   np.zeros(2, dtype=np.int64), pause)

    def stop(self) -> None:
        """End the loop (within ``POLL_S``) and wait for the thread (idempotent)."""
        self.board.ints[STOP] = 1
        if self.is_alive():
            self.join()
