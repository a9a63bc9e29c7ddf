"""Host time for the controller: one monotonic time base (:class:`Clock`), the real one :class:`RealClock`
(tests use :class:`kdvfs.runtime.testing.fake_gpu.VirtualClock`)."""

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
