"""The controller process's view of the training process's GPU timeline (``own_process``).

:class:`RemoteTimeline` is a :class:`~kdvfs.runtime.controller.timing.gpu_timeline.BoardTimeline` on the training
process's event board, mapped here (the training process records marks and anchors there and its poller writes when
the GPU passed them: no question crosses for the timeline); its :meth:`~BoardTimeline.mark` numbers the steps the
training process announced. In a run whose steps vary, :meth:`RemoteTimeline.shape_of` asks the training process's
:class:`~kdvfs.runtime.controller.control.shape_server.ShapeServer` over a connection and waits for its answer (one
question at a time, under a lock). :class:`RemoteHooks` stands in for the anchor hooks installed in the training
process: their ``every``, and the top-level blocks they found as the board's ``BLOCKS`` says. Host times are
``time.perf_counter``'s, one clock for both processes on the same host.

Failure modes: an error the shape server met is raised here as :class:`RemoteTimelineError` (the controller's thread
then returns the GPU to auto); a closed connection (the training process ended) raises it too.
"""

from __future__ import annotations

import threading
from multiprocessing.connection import Connection
from typing import Any

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.trace.shape import StepShape
from kdvfs.runtime.controller.timing.gpu_events.board import BLOCKS, EventBoard
from kdvfs.runtime.controller.timing.gpu_timeline import BoardTimeline
from kdvfs.runtime.device.host_time import Clock


class RemoteTimelineError(KdvfsError):
    """The training process could not answer a question about its steps."""


class RemoteTimeline(BoardTimeline):
    """See the module docstring. ``board``: the training process's; ``connection``: to its shape server;
    ``hooks_every``: the ``every`` of the anchor hooks installed there (None: none are)."""

    def __init__(self, board: EventBoard, clock: Clock, connection: Connection, hooks_every: int | None) -> None:
        super().__init__(board, clock)
        self.connection = connection
        self.hooks = None if hooks_every is None else RemoteHooks(board, hooks_every)
        self._lock = threading.Lock()
        self._new_inputs: tuple[int, tuple[int, ...] | None] = (-1, None)

    def _ask(self, *question: Any) -> Any:
        with self._lock:
            try:
                self.connection.send(question)
                ok, value = self.connection.recv()
            except (EOFError, OSError) as error:
                raise RemoteTimelineError(f"the training process stopped answering ({error!r})") from error
        if not ok:
            raise RemoteTimelineError(f"the training process's shape probe failed: {value}")
        return value

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


class RemoteHooks:
    """The anchor hooks of the training process, as the controller process knows them: ``every`` and
    ``blocks`` (the board's ``BLOCKS``; installed and removed there: here :meth:`install` and :meth:`remove` do
    nothing)."""

    def __init__(self, board: EventBoard, every: int) -> None:
        self._board, self.every = board, every

    @property
    def blocks(self) -> int:
        return int(self._board.ints[BLOCKS])

    def install(self) -> None:
        """Nothing: the hooks are the training process's."""

    def remove(self) -> None:
        """Nothing: the hooks are the training process's."""
