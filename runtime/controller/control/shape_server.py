"""The training process's side of a controller that runs in a process of its own (``own_process``): the shape
server.

The training process keeps what must run beside the training loop: the step marks and the anchor hooks, recorded
on the event board the controller process reads itself (:mod:`kdvfs.runtime.controller.timing.gpu_events`), and, in
a run whose steps vary, its shape probe. :class:`ShapeServer` is a thread there that answers the controller
process's one question, ``("shape_of", step, deadline_s)`` (the shape probe's answer), one at a time, over a
:class:`multiprocessing.connection.Connection`. Each answer is ``(ok, value)``: whether the call returned, and its
value (else the error's text). Between questions the thread blocks in the connection, without the interpreter lock;
its CPU goes to the board (``SERVER_CPU_S``) after each answer.

Invariants: a closed connection (the controller process ended) ends the thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from kdvfs.runtime.controller.timing.gpu_events.board import SERVER_CPU_S, EventBoard


class ShapeServer(threading.Thread):
    """Answers a controller process's ``shape_of`` questions (module docstring) with ``shape_of``, counting its
    CPU on ``board``."""

    def __init__(self, connection: Connection, shape_of: Callable[[int, float], Any], board: EventBoard) -> None:
        super().__init__(name="kdvfs-shapes", daemon=True)
        self.connection, self._shape_of, self.board = connection, shape_of, board
        self.questions = 0

    def run(self) -> None:
        while True:
            try:
                name, *args = self.connection.recv()
            except (EOFError, OSError):
                return
            self.questions += 1
            try:
                if name != "shape_of":
                    raise ValueError(f"no such question {name!r} (known: shape_of)")
                answer: tuple[bool, Any] = (True, self._shape_of(*args))
            except Exception as error:  # the controller process reports it; training goes on
                answer = (False, f"{type(error).__name__}: {error}")
            self.board.floats[SERVER_CPU_S] = time.thread_time()
            try:
                self.connection.send(answer)
            except (BrokenPipeError, OSError):
                return
