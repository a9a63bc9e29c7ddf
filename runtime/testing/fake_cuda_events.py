"""A fake GPU's timing events and the driver calls on them, for the event board's tests
(:mod:`kdvfs.runtime.controller.timing.gpu_events`): what ``torch.cuda.Event`` and ``cuEventQuery`` /
``cuEventElapsedTime`` are to the recorder and the poller on a real GPU.

:class:`FakeCudaEvents` keeps a GPU time (``gpu_s``, s, set by the test): an event recorded takes it, and the GPU
has passed it once ``passed_s`` (default: at once) reaches it. Its :meth:`FakeCudaEvents.calls` are ctypes callbacks
the poller's native loop calls like the driver's (each takes the interpreter lock: a test's GPU, not a fast one).
"""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Any

from kdvfs.runtime.controller.timing.gpu_events.driver import (
    CUDA_ERROR_NOT_READY,
    CUDA_SUCCESS,
    ELAPSED,
    QUERY,
    EventCalls,
    pointer,
)

INVALID_HANDLE = 400
"""``CUDA_ERROR_INVALID_HANDLE``: an event never recorded."""


class FakeCudaEvents:
    """See the module docstring. ``gpu_s``: the GPU time an event recorded now takes (s); ``passed_s``: the GPU has
    passed every event recorded at or before it (s; default ``inf``)."""

    def __init__(self) -> None:
        self.gpu_s = 0.0
        self.passed_s = math.inf
        self.recorded: dict[int, float] = {}
        """Each recorded event's GPU time (s), by handle."""
        self.queries = 0
        self._handles = iter(range(1, 1 << 62))
        self._lock = threading.Lock()
        self._callbacks = (QUERY(self._query), ELAPSED(self._elapsed))  # kept alive while the calls are

    def new_event(self) -> FakeEvent:
        """A timing event (``torch.cuda.Event(enable_timing=True)``); its handle is made at its first record."""
        return FakeEvent(self)

    def record(self, event: FakeEvent) -> int:
        """Record ``event`` at ``gpu_s``; its handle."""
        with self._lock:
            handle = event.handle or next(self._handles)
            self.recorded[handle] = self.gpu_s
        return handle

    def calls(self) -> EventCalls:
        """The driver's event calls on these events (no CUDA context to make current)."""
        query, elapsed = self._callbacks
        return EventCalls(pointer(QUERY, query), pointer(ELAPSED, elapsed), lambda: 0, lambda handle: None)

    def _query(self, handle: int) -> int:
        with self._lock:
            self.queries += 1
            recorded_s = self.recorded.get(handle)
        if recorded_s is None:
            return INVALID_HANDLE
        return CUDA_SUCCESS if recorded_s <= self.passed_s else CUDA_ERROR_NOT_READY

    def _elapsed(self, ms: Any, start: int, end: int) -> int:
        with self._lock:
            times_s = self.recorded.get(start), self.recorded.get(end)
        if times_s[0] is None or times_s[1] is None:
            return INVALID_HANDLE
        ctypes.cast(ms, ctypes.POINTER(ctypes.c_float))[0] = (times_s[1] - times_s[0]) * 1e3
        return CUDA_SUCCESS


class FakeEvent:
    """A :class:`FakeCudaEvents` event: :meth:`record` (on any stream) and ``cuda_event`` (its handle; 0 before its
    first record)."""

    def __init__(self, events: FakeCudaEvents) -> None:
        self._events = events
        self.handle = 0

    def record(self, stream: object = None) -> None:
        self.handle = self._events.record(self)

    @property
    def cuda_event(self) -> int:
        return self.handle
