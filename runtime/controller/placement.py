"""Where the controller's thread runs: on the CPU the training thread last ran on (``follow_trainer_cpu``).

Each wake of the controller's thread takes the interpreter lock from a training loop that holds it most of
the time. On a virtual machine (the H200 host) a core that idled through the gap between two decisions
comes back cold: a decision that takes ~20 us back to back takes ~100 us after a 6 ms sleep
(``docs/controller.md``, "A cold core"), and the training thread, blocked on the lock meanwhile, is woken
on its own core afterwards. A launch-bound training thread's core does not idle. Following it, the
controller's thread decides on a core that is running, hands the lock over without waking another one, and
takes from the training thread the CPU it would have waited for anyway.

The training thread reads its CPU at every step mark (:meth:`TrainerCpu.mark`, ``sched_getcpu``: ~1 us); the
controller's thread moves itself there when it handles the step (:meth:`TrainerCpu.follow`, one
``sched_setaffinity`` when the CPU changed). Where it cannot (no ``sched_getcpu``, a CPU outside the
thread's allowed set) it stays where it is, and the summary says why.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any


class TrainerCpu:
    """The training thread's CPU, and the controller's thread following it. Attributes: ``moves`` (times the
    thread moved), ``error`` (why it stopped following; None while it does)."""

    def __init__(self) -> None:
        self.moves = 0
        self.error: str | None = None
        self._cpu = -1
        self._pinned = -1
        libc = ctypes.CDLL(None, use_errno=True)
        self._sched_getcpu: Any = getattr(libc, "sched_getcpu", None)
        if self._sched_getcpu is None or not hasattr(os, "sched_setaffinity"):
            self.error = "this platform has no sched_getcpu or sched_setaffinity"
            return
        self._sched_getcpu.restype, self._sched_getcpu.argtypes = ctypes.c_int, []

    def mark(self) -> None:
        """Read the calling (training) thread's CPU."""
        if self.error is None:
            self._cpu = self._sched_getcpu()

    def follow(self) -> None:
        """Move the calling (controller's) thread onto the CPU last marked, if it is not there yet."""
        cpu = self._cpu
        if self.error is not None or cpu < 0 or cpu == self._pinned:
            return
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError as error:
            self.error = f"could not move the controller's thread to CPU {cpu}: {error}"
            return
        self._pinned, self.moves = cpu, self.moves + 1

    def figures(self) -> dict[str, Any]:
        """For the summary."""
        return {"moves": self.moves, "cpu": None if self._pinned < 0 else self._pinned, "error": self.error}
