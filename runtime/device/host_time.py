"""Host time for the controller: the real monotonic clock, or a virtual one for tests (no sleeping)."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Seconds on one monotonic host time base; ``sleep_until`` returns False when ``stop`` was set first."""

    def now_s(self) -> float: ...

    def sleep_until(self, time_s: float, stop: threading.Event) -> bool: ...


class RealClock:
    """``time.perf_counter``; sleeps on ``stop`` so that a stop request ends the sleep at once."""

    def now_s(self) -> float:
        return time.perf_counter()

    def sleep_until(self, time_s: float, stop: threading.Event) -> bool:
        delay_s = time_s - time.perf_counter()
        if delay_s > 0:
            return not stop.wait(delay_s)
        return not stop.is_set()


class VirtualClock:
    """A clock that jumps: ``sleep_until`` moves it forward instead of waiting. Thread-safe."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s
        self._lock = threading.Lock()

    def now_s(self) -> float:
        with self._lock:
            return self._now_s

    def advance_to(self, time_s: float) -> None:
        """Move the clock to ``time_s`` (never backwards)."""
        with self._lock:
            self._now_s = max(self._now_s, time_s)

    def sleep_until(self, time_s: float, stop: threading.Event) -> bool:
        if stop.is_set():
            return False
        self.advance_to(time_s)
        return True
