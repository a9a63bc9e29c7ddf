"""A virtual clock for one sleeping thread that runs scripted actions as their times pass: :class:`ScriptedClock`."""

from __future__ import annotations

import threading
from collections.abc import Callable

from kdvfs.runtime.testing.fake_gpu import VirtualClock


class ScriptedClock(VirtualClock):
    """A virtual clock moved only by one thread's sleeps (and whatever that thread advances it by, such as a
    read's duration), which runs ``script`` actions as their times pass (a mark wakes the sleeper as it would in
    real time) and parks the thread at ``end_s`` (``at_end`` is then set; the thread waits there for its stop)."""

    def __init__(self, end_s: float, script: list[tuple[float, Callable[[], None]]], start_s: float = 0.0) -> None:
        super().__init__(start_s)
        self.end_s, self.script = end_s, sorted(script, key=lambda item: item[0])
        self.at_end = threading.Event()

    def sleep_until(self, time_s: float, stop: threading.Event) -> bool:
        while self.script and self.script[0][0] <= min(time_s, self.end_s):
            at_s, action = self.script.pop(0)
            self.advance_to(at_s)
            action()
            if stop.is_set():
                return False
        if time_s >= self.end_s:
            self.advance_to(self.end_s)
            self.at_end.set()
            stop.wait()
            return False
        return super().sleep_until(time_s, stop)
