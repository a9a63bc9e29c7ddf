"""The controller process's side of ``own_process`` (:mod:`~kdvfs.runtime.controller.training.own_process`):
``python -m`` this module opens the whole controller on the training process's timeline, its event board mapped
here (:class:`~kdvfs.runtime.controller.control.remote_timeline.RemoteTimeline`), hands it each step the training
process announces, and at the end closes it (clocks restored) and sends back its summary and windows. It ignores
SIGINT (the training process's Ctrl-C ends training, whose end closes this process's connection); a closed
connection closes the controller. Nothing in the package imports this module: ``-m`` runs it fresh.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
from multiprocessing.connection import Connection
from pathlib import Path

from kdvfs.common.errors import KdvfsError
from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.control.remote_timeline import RemoteTimeline
from kdvfs.runtime.controller.controller import Controller
from kdvfs.runtime.controller.shapes.varying import varying_steps
from kdvfs.runtime.controller.timing.gpu_events.board import EventBoard
from kdvfs.runtime.device.host_time import RealClock


def serve(config: ControllerConfig, questions: Connection, steps: Connection, board: EventBoard,
          hooks_every: int | None) -> None:
    """The child: open the controller on the training process's timeline, hand it each announced step until
    told to close (``None``) or the training process is gone, then close it and send back its summary."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    config = dataclasses.replace(config, own_process=False)  # this process is the controller's own
    timeline = RemoteTimeline(board, RealClock(), questions, hooks_every)
    found = varying_steps(config.trace, RealClock())
    varying = None if found is None else dataclasses.replace(found[0], shape_of=timeline.shape_of,
                                                              new_inputs=timeline.new_inputs)
    controller = Controller(config=config, timeline=timeline, varying=varying, look_for_varying=False)
    try:
        controller.__enter__()
    except BaseException as error:
        steps.send(("failed", str(error) if isinstance(error, KdvfsError) else f"{type(error).__name__}: {error}"))
        return
    steps.send(("opened", None if found is None else found[1].inputs))
    try:
        while True:
            try:
                step = steps.recv()
            except (EOFError, OSError):
                break
            if step is None:
                break
            controller.step()
    finally:
        controller.close()
        with contextlib.suppress(BrokenPipeError, OSError):
            steps.send(("closed", (controller.summary, controller.windows)))


def main(argv: list[str]) -> int:
    """``python -m kdvfs.runtime.controller.training.controller_process CONFIG QUESTIONS_FD STEPS_FD BOARD_FD
    HOOKS_EVERY`` (``HOOKS_EVERY`` 0: no anchor hooks in the training process)."""
    config = ControllerConfig.load(Path(argv[0]))
    questions, steps = Connection(int(argv[1])), Connection(int(argv[2]))
    serve(config, questions, steps, EventBoard.attach(int(argv[3])), int(argv[4]) or None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
