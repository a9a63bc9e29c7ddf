"""Host time for the controller: one monotonic time base (:class:`Clock`), the real one :class:`RealClock`
(tests use :class:`kdvfs.runtime.testing.fake_gpu.VirtualClock`), and :class:`CountingClock`, which counts a
thread's sleeps."""

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


class CountingClock:
    """``clock`` for one thread, counting its sleeps (``sleeps``: calls of :meth:`sleep_until` for a time still
    ahead)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.sleeps = 0

    def now_s(self) -> float:
        return self._clock.now_s()

    def sleep_until(self, time_s: float, stop: threading.Event) -> bool:
        if time_s > self._clock.now_s():
            self.sleeps += 1
        return self._clock.sleep_until(time_s, stop)
