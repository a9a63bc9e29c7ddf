"""The training process's side of a controller that runs in a process of its own (``own_process``).

The training process keeps what must run beside the training loop: the step marks and the anchor hooks on its
GPU timeline (:mod:`kdvfs.runtime.controller.timing.gpu_timeline`) and, in a run whose steps vary, its shape
probe. :class:`TimelineServer` is a thread there that answers the controller process's questions about that
timeline, one at a time, over a :class:`multiprocessing.connection.Connection`: ``(name, *args)`` for ``wait``,
``anchor_s``, ``passed_anchor`` and ``shape_of`` (the timeline's and the shape probe's methods of those names),
and ``figures`` (the hooks' time, the timeline's sleeps and this thread's CPU). Each answer is
``(ok, value, blocks)``: whether the call returned, its value (else the error's text), and the anchor hooks'
top-level blocks found so far (0: none, or no hooks). Between questions the thread blocks in the connection,
without the interpreter lock; a question costs the training process the lock for the call and the pickling.

Invariants: a ``wait`` is asked only for a step whose mark :meth:`TimelineServer.add` recorded first (the
controller process learns of a step only after it is recorded); a closed connection (the controller process
ended) ends the thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from kdvfs.runtime.controller.timing.anchor_hooks import AnchorHooks
from kdvfs.runtime.controller.timing.gpu_timeline import KEEP_STEPS, StepTimeline

QUESTIONS = ("wait", "anchor_s", "passed_anchor", "shape_of", "figures")


class TimelineServer(threading.Thread):
    """Answers a controller process's questions (module docstring) about ``timeline``, whose step marks
    :meth:`add` records; ``hooks``: the anchor hooks on it (None: none); ``shape_of``: each step's shape (a run
    whose steps vary; None: none)."""

    def __init__(self, connection: Connection, timeline: StepTimeline, hooks: AnchorHooks | None,
                 shape_of: Callable[[int, float], Any] | None = None) -> None:
        super().__init__(name="kdvfs-timeline", daemon=True)
        self.connection, self.timeline, self.hooks, self._shape_of = connection, timeline, hooks, shape_of
        self._tokens: dict[int, Any] = {}
        self._marks = 0
        self.questions = 0
        self.cpu_s = 0.0
        """This thread's CPU time (s), as of its last answer."""

    def add(self, token: Any) -> int:
        """Record the mark ``token`` of the next step (on the training thread); its step number. A mark not
        waited for within ``KEEP_STEPS`` steps is dropped (a controller that stopped asking)."""
        step = self._marks
        self._tokens[step] = token
        self._tokens.pop(step - KEEP_STEPS, None)
        self._marks += 1
        return step

    def run(self) -> None:
        while True:
            try:
                question = self.connection.recv()
            except (EOFError, OSError):
                return
            self.questions += 1
            try:
                answer: tuple[bool, Any, int] = (True, self._answer(question), self._blocks())
            except Exception as error:  # the controller process reports it; training goes on
                answer = (False, f"{type(error).__name__}: {error}", self._blocks())
            self.cpu_s = time.thread_time()
            try:
                self.connection.send(answer)
            except (BrokenPipeError, OSError):
                return

    def _blocks(self) -> int:
        return 0 if self.hooks is None else self.hooks.blocks

    def _answer(self, question: tuple[Any, ...]) -> Any:
        name, *args = question
        if name == "wait":
            step, expected_s = args
            return self.timeline.wait(self._tokens.pop(step), expected_s)
        if name == "anchor_s":
            return self.timeline.anchor_s(*args)
        if name == "passed_anchor":
            return self.timeline.passed_anchor(*args)
        if name == "shape_of" and self._shape_of is not None:
            return self._shape_of(*args)
        if name == "figures":
            return (getattr(self.timeline, "hook_s", None), getattr(self.timeline, "sleeps", 0),
                    time.thread_time())
        raise ValueError(f"no such question {name!r} (known: {', '.join(QUESTIONS)})")
