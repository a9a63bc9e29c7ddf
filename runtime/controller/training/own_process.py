"""The controller in a process of its own (``ControllerConfig.own_process``; ``kdvfs run``'s default, under torchrun
one a rank).

:class:`ProcessController` runs the whole :class:`~kdvfs.runtime.controller.controller.Controller` in a child
process (``python -m`` :mod:`~kdvfs.runtime.controller.training.controller_process`: a fresh interpreter, no CUDA
state, the training script not run again), off the training process's interpreter lock; the training process keeps
the step marks and anchor hooks, on an event board the child maps (``timing.gpu_events``), and, in a run whose steps
vary, the shape probe and its server (``control.shape_server``). It opens, steps and closes as a controller does; a
check that fails in the child raises here (``KdvfsError``), clocks untouched. Each step's mark is recorded here,
then its number sent to the child; closing has the child close its controller (clocks restored) and send back the
summary and windows. Failure modes: the child ending early leaves training at the GPU's own clocks (restored by the
child or its watchdog), no summary, ``error`` saying why; the training process ending closes the child's connection
and the child restores; the child ignores SIGINT. Under torchrun the child inherits the rank's environment: its
controller opens the rank's GPU and joins the job's lockstep (:class:`~kdvfs.runtime.job.JobGroup`) as one in the
training process would. Design: docs/design/controller.md (Threads).
"""

from __future__ import annotations

import atexit
import contextlib
import socket
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kdvfs.common.errors import KdvfsError
from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.control.assembly import anchor_hooks
from kdvfs.runtime.controller.control.managed import Managed
from kdvfs.runtime.controller.control.shape_server import ShapeServer
from kdvfs.runtime.controller.model.run_summary import RunSummary
from kdvfs.runtime.controller.shapes.varying import StepShapes
from kdvfs.runtime.controller.timing.anchor_hooks import AnchorHooks
from kdvfs.runtime.controller.timing.gpu_events.board import BLOCKS, EventBoard
from kdvfs.runtime.controller.timing.gpu_timeline import BoardTimeline, local_timeline
from kdvfs.runtime.device.host_time import Clock, RealClock

CHILD_MODULE = "kdvfs.runtime.controller.training.controller_process"
"""What the child runs (``python -m``): a module the package does not import, so ``-m`` runs it fresh."""
CLOSE_TIMEOUT_S = 60.0
"""Longest wait for the child to close its controller and send the summary (s); then it is terminated, and killed
after as long again (its watchdog then resets the clocks)."""


class ProcessController(Managed):
    """See the module docstring. ``config``: the controller's; ``clock``: the training process's host clock
    (the child's is the real one: host times must agree)."""

    def __init__(self, config: ControllerConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.summary: RunSummary | None = None
        self.windows: list[dict[str, Any]] = []
        self.error: str | None = None
        """Why the child ended without a summary (None: it did not)."""
        self._clock = clock or RealClock()
        self._stack = contextlib.ExitStack()
        self._process: Any = None
        self._steps: Connection | None = None
        self._timeline: BoardTimeline | None = None
        self._hooks: AnchorHooks | None = None
        self._step_shapes: StepShapes | None = None
        self._alive = False

    def _open(self) -> None:
        board = EventBoard.shared()
        self._stack.callback(board.close_fd)
        self._timeline = timeline = local_timeline(self._clock, self.config.cpu_test_mode, board)
        self._stack.callback(timeline.stop)
        self._hooks = hooks = anchor_hooks(self.config, timeline)
        questions, steps, inputs = self._start_child(None if hooks is None else hooks.every, board)
        board.close_fd()
        if inputs is not None:
            self._step_shapes = StepShapes(self._clock, inputs)
            self._step_shapes.probe.install()
            self._stack.callback(self._step_shapes.probe.remove)
            ShapeServer(questions, self._step_shapes.shape_and_new_inputs, board).start()
        self._steps, self._alive = steps, True
        self._exit_on_sigterm()
        if hooks is not None:
            hooks.install()
            self._stack.callback(hooks.remove)

    def _start_child(self, hooks_every: int | None, board: EventBoard) -> tuple[Connection, Connection, int | None]:
        """Start the child on two socket pairs and ``board``'s memfd and wait until it opened its controller: the
        connections for the shape questions and for the steps, and the inputs a step's shape holds (None: the
        steps do not vary). Raises the child's error when it could not open."""
        pairs = [socket.socketpair() for _ in range(2)]
        for ours, _ in pairs:
            self._stack.callback(ours.close)
        with tempfile.TemporaryDirectory(prefix="kdvfs-controller-") as folder:
            config_path = Path(folder) / "config.json"
            self.config.save(config_path)
            theirs = [child.fileno() for _, child in pairs]
            assert board.fd is not None
            self._process = subprocess.Popen(
                [sys.executable, "-m", CHILD_MODULE, str(config_path), *map(str, theirs), str(board.fd),
                 str(hooks_every or 0)], pass_fds=[*theirs, board.fd])
            for _, child in pairs:
                child.close()
            questions, steps = (Connection(ours.detach()) for ours, _ in pairs)
            self._stack.callback(questions.close)
            self._stack.callback(steps.close)
            try:
                kind, value = steps.recv()
            except EOFError:
                kind, value = "failed", f"the controller process ended while opening (exit code {self._process.wait()})"
        if kind == "failed":
            self._process.wait()
            raise KdvfsError(value)
        return questions, steps, value

    def step(self) -> None:
        """Mark the end of a training step (once per optimizer step): recorded here, announced to the child."""
        if self._step_shapes is not None:
            self._step_shapes.mark_step()
        if not self._alive or self._timeline is None or self._steps is None:
            return
        if self._hooks is not None:
            self._timeline.board.ints[BLOCKS] = self._hooks.blocks
        step = self._timeline.mark()
        try:
            self._steps.send(step)
        except (BrokenPipeError, OSError):
            self._alive = False
            print("kdvfs: the controller process ended; training continues at the GPU's own clocks",
                  file=sys.stderr)

    def close(self) -> None:
        """Have the child close its controller (clocks restored) and take its summary; stop everything here
        (idempotent; a SIGTERM meanwhile waits for the end, then raises ``SystemExit``)."""
        self._hold_sigterm()
        atexit.unregister(self.close)
        if self._alive and self._steps is not None:
            self._alive = False
            self._collect(self._steps)
        if self._process is not None:
            try:
                self._process.wait(CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.terminate()  # its SIGTERM handler closes the controller
                try:
                    self._process.wait(CLOSE_TIMEOUT_S)
                except subprocess.TimeoutExpired:  # a close stuck past its own timeouts: the watchdog resets
                    self._process.kill()
                    self._process.wait()
            if self.summary is None and self.error is None:
                self.error = f"the controller process ended without a summary (exit code {self._process.returncode})"
        self._stack.close()

    def _collect(self, steps: Connection) -> None:
        """Ask the child to close and keep what it sends back (or why nothing came)."""
        try:
            steps.send(None)
            if not steps.poll(CLOSE_TIMEOUT_S):
                self.error = f"the controller process sent no summary within {CLOSE_TIMEOUT_S:.0f} s"
                return
            _, (self.summary, self.windows) = steps.recv()
        except (EOFError, OSError) as error:
            self.error = f"the controller process ended without a summary ({error!r})"
