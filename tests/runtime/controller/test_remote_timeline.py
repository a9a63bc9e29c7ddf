"""A controller in its own process reads the training process's event board, mapped from its memfd, and asks only
for step shapes, through a connection: the answers are the shape probe's, an error there is raised here saying so,
and a training process that is gone is an error too."""

from __future__ import annotations

import os
import socket
from multiprocessing.connection import Connection

import pytest

from kdvfs.runtime.controller.control.remote_timeline import RemoteTimeline, RemoteTimelineError
from kdvfs.runtime.controller.control.shape_server import ShapeServer
from kdvfs.runtime.controller.timing.gpu_events.board import BLOCKS, SERVER_CPU_S, EventBoard
from kdvfs.runtime.controller.timing.gpu_events.recorder import HostRecorder
from kdvfs.runtime.device.host_time import RealClock


def _pair(shape_of: object) -> tuple[ShapeServer, RemoteTimeline, EventBoard]:
    ours, theirs = socket.socketpair()
    board = EventBoard.shared()
    assert board.fd is not None
    server = ShapeServer(Connection(ours.detach()), shape_of, board)  # type: ignore[arg-type]
    server.start()
    remote = RemoteTimeline(EventBoard.attach(os.dup(board.fd)), RealClock(), Connection(theirs.detach()), 2)
    board.close_fd()
    return server, remote, board


def test_the_remote_timeline_reads_the_training_processs_board_and_asks_its_shapes() -> None:
    server, remote, board = _pair(lambda step, deadline_s: (("shape", step), (3, 1) if step == 9 else (0, 0)))
    host = {"s": 5.0}
    recorder = HostRecorder(board, lambda: host["s"], lambda: host["s"] / 10)
    for _ in range(2):
        recorder.mark()
        host["s"] += 1.0
    board.ints[BLOCKS] = 12
    assert [remote.mark(), remote.mark()] == [0, 1]  # numbers the steps the training process announced
    end = remote.wait(1)
    assert (end.end_s, end.duration_s) == (6.0, pytest.approx(0.1))
    assert remote.shape_of(9, 1.0) == ("shape", 9)
    assert (remote.new_inputs(9), remote.new_inputs(8)) == ((3, 1), None)  # the answer's, for its step only
    assert remote.hooks is not None and (remote.hooks.every, remote.hooks.blocks) == (2, 12)
    assert remote.server_cpu_s == board.floats[SERVER_CPU_S] > 0
    remote.connection.close()
    server.join(5)
    assert not server.is_alive() and server.questions == 1


def test_an_error_there_is_raised_here_and_a_closed_training_process_too() -> None:
    def failing(step: int, deadline_s: float) -> None:
        raise RuntimeError("no such step")

    server, remote, _ = _pair(failing)
    with pytest.raises(RemoteTimelineError, match="shape probe failed: RuntimeError: no such step"):
        remote.shape_of(0, 1.0)
    remote.connection.send(("figures",))
    assert remote.connection.recv() == (False, "ValueError: no such question 'figures' (known: shape_of)")
    remote.connection.close()
    server.join(5)
    assert not server.is_alive()  # the controller process gone: the server ends
    ours, theirs = socket.socketpair()
    gone = RemoteTimeline(EventBoard.local(), RealClock(), Connection(theirs.detach()), None)
    ours.close()  # the training process gone
    with pytest.raises(RemoteTimelineError, match="stopped answering"):
        gone.shape_of(0, 1.0)
    assert gone.hooks is None


def test_a_controller_told_to_run_in_its_own_process_says_which_class_does() -> None:
    from kdvfs.common.errors import KdvfsError
    from kdvfs.runtime.controller import Controller

    with pytest.raises(KdvfsError, match=r"use ProcessController\(config\)"):
        Controller("plan.json", "step.trace.json", own_process=True).__enter__()
