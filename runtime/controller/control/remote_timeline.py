"""The controller process's view of the training process's GPU timeline (``own_process``).

:class:`RemoteTimeline` is a :class:`~kdvfs.runtime.controller.timing.gpu_timeline.StepTimeline` whose
questions go to the training process's :class:`~kdvfs.runtime.controller.control.timeline_server.TimelineServer`
over a connection and wait for its answer (one question at a time, under a lock). Its :meth:`RemoteTimeline.mark`
only numbers the steps the training process announced (the marks themselves are recorded there); the step
number is the token :meth:`RemoteTimeline.wait` sends. :class:`RemoteHooks` stands in for the anchor hooks
installed in the training process: their ``every`` and the top-level blocks they found, as the last answer
carried them. Host times are ``time.perf_counter``'s, one clock for both processes on the same host.

Failure modes: an error the server met is raised here as :class:`RemoteTimelineError` (the controller's thread
then returns the GPU to auto); a closed connection (the training process ended) raises it too.
"""

from __future__ import annotations

import contextlib
import math
import threading
from multiprocessing.connection import Connection
from typing import Any

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.trace.shape import StepShape
from kdvfs.runtime.controller.timing.gpu_timeline import StepEnd


class RemoteTimelineError(KdvfsError):
    """The training process could not answer a question about its timeline."""


class RemoteTimeline:
    """See the module docstring. ``connection``: to the training process's timeline server; ``hooks_every``: the
    ``every`` of the anchor hooks installed there (None: none are)."""

    def __init__(self, connection: Connection, hooks_every: int | None) -> None:
        self.connection = connection
        self.hooks = None if hooks_every is None else RemoteHooks(self, hooks_every)
        self._lock = threading.Lock()
        self._marks = 0
        self._new_inputs: tuple[int, tuple[int, ...] | None] = (-1, None)
        self.blocks = 0
        """The anchor hooks' top-level blocks, as of the last answer."""
        self.hook_s: float | None = None
        self.sleeps = 0
        self.server_cpu_s: float | None = None
        """The hooks' time, the timeline's sleeps and the timeline server's CPU in the training process (s), as
        of :meth:`fetch_figures` (None before it)."""

    def _ask(self, *question: Any) -> Any:
        with self._lock:
            try:
                self.connection.send(question)
                ok, value, self.blocks = self.connection.recv()
            except (EOFError, OSError) as error:
                raise RemoteTimelineError(f"the training process stopped answering ({error!r})") from error
        if not ok:
            raise RemoteTimelineError(f"the training process's timeline failed: {value}")
        return value

    def mark(self) -> int:
        """The next step's number (the training process recorded its mark before announcing it)."""
        step = self._marks
        self._marks += 1
        return step

    def wait(self, token: int, expected_s: float = -math.inf) -> StepEnd:
        end: StepEnd = self._ask("wait", token, expected_s)
        return end

    def anchor_s(self, step: int, index: int, deadline_s: float) -> float | None:
        passed: float | None = self._ask("anchor_s", step, index, deadline_s)
        return passed

    def passed_anchor(self, step: int, after: int) -> tuple[int, float] | None:
        passed: tuple[int, float] | None = self._ask("passed_anchor", step, after)
        return passed

    def shape_of(self, step: int, deadline_s: float) -> StepShape | None:
        """Step ``step``'s shape, from the training process's shape probe (a run whose steps vary); the answer
        also says which of its inputs had a shape new to the process (:meth:`new_inputs`)."""
        answer: tuple[StepShape | None, tuple[int, ...] | None] = self._ask("shape_of", step, deadline_s)
        shape, new_inputs = answer
        self._new_inputs = (step, new_inputs)
        return shape

    def new_inputs(self, step: int) -> tuple[int, ...] | None:
        """For each input position, step ``step``'s forward calls with a shape new there, as :meth:`shape_of`'s
        last answer said (None: that answer was another step's)."""
        asked, new_inputs = self._new_inputs
        return new_inputs if asked == step else None

    def fetch_figures(self) -> None:
        """Ask for the training process's figures (:attr:`hook_s`, :attr:`sleeps`, :attr:`server_cpu_s`); they
        stay None where it no longer answers."""
        with contextlib.suppress(RemoteTimelineError):
            self.hook_s, self.sleeps, self.server_cpu_s = self._ask("figures")


class RemoteHooks:
    """The anchor hooks of the training process, as the controller process knows them: ``every`` and
    ``blocks`` (installed and removed there: here :meth:`install` and :meth:`remove` do nothing)."""

    def __init__(self, timeline: RemoteTimeline, every: int) -> None:
        self._timeline, self.every = timeline, every

    @property
    def blocks(self) -> int:
        return self._timeline.blocks

    def install(self) -> None:
        """Nothing: the hooks are the training process's."""

    def remove(self) -> None:
        """Nothing: the hooks are the training process's."""
