"""A controller in its own process asks the training process's timeline through a connection: the answers are the
timeline's own, an error there is raised here saying so, and a training process that is gone is an error too."""

from __future__ import annotations

import math
import socket
from multiprocessing.connection import Connection

import pytest

from kdvfs.runtime.controller.control.remote_timeline import RemoteTimeline, RemoteTimelineError
from kdvfs.runtime.controller.control.timeline_server import TimelineServer
from kdvfs.runtime.controller.timing.gpu_timeline import KEEP_STEPS, StepEnd


class ScriptedTimeline:
    """A timeline whose step ``i`` ends at ``i`` s after 1 s of GPU time, with anchor ``j`` passed at ``i + j/10``."""

    hook_s, sleeps = 0.25, 7

    def mark(self) -> int:
        return 0

    def wait(self, token: int, expected_s: float = -math.inf) -> StepEnd:
        return StepEnd(float(token), 1.0, None, (token + 0.1,))

    def anchor_s(self, step: int, index: int, deadline_s: float) -> float | None:
        return step + index / 10

    def passed_anchor(self, step: int, after: int) -> tuple[int, float] | None:
        if after >= 3:
            raise RuntimeError("no such anchor")
        return after + 1, step + (after + 1) / 10


class Blocks:
    every, blocks = 2, 12


def _pair(shape_of: object = None) -> tuple[TimelineServer, RemoteTimeline, Connection]:
    ours, theirs = socket.socketpair()
    server_side, remote_side = Connection(ours.detach()), Connection(theirs.detach())
    server = TimelineServer(server_side, ScriptedTimeline(), Blocks(), shape_of)  # type: ignore[arg-type]
    server.start()
    return server, RemoteTimeline(remote_side, 2), server_side


def test_the_remote_timeline_answers_as_the_training_processs_does() -> None:
    server, remote, _ = _pair(lambda step, deadline_s: (("shape", step), (3, 1) if step == 9 else (0, 0)))
    for token in (5, 6):
        assert server.add(token) == token - 5
    assert [remote.mark(), remote.mark()] == [0, 1]
    assert remote.wait(1) == StepEnd(6.0, 1.0, None, (6.1,))
    assert remote.anchor_s(3, 2, 10.0) == pytest.approx(3.2)
    assert remote.passed_anchor(4, 0) == (1, pytest.approx(4.1))
    assert remote.shape_of(9, 1.0) == ("shape", 9)
    assert (remote.new_inputs(9), remote.new_inputs(8)) == ((3, 1), None)  # the answer's, for its step only
    assert remote.hooks is not None and (remote.hooks.every, remote.hooks.blocks) == (2, 12)
    remote.fetch_figures()
    assert (remote.hook_s, remote.sleeps) == (0.25, 7) and remote.server_cpu_s is not None
    remote.connection.close()
    server.join(5)
    assert not server.is_alive() and server.questions == 5


def test_an_error_there_is_raised_here_and_a_closed_training_process_too() -> None:
    server, remote, _ = _pair()
    with pytest.raises(RemoteTimelineError, match="timeline failed: RuntimeError: no such anchor"):
        remote.passed_anchor(0, 3)
    with pytest.raises(RemoteTimelineError, match="no such question 'shape_of'"):
        remote.shape_of(0, 1.0)  # a run of one shape has no shape probe
    remote.connection.close()
    server.join(5)
    assert not server.is_alive()  # the controller process gone: the server ends
    ours, theirs = socket.socketpair()
    gone = RemoteTimeline(Connection(theirs.detach()), None)
    ours.close()  # the training process gone
    with pytest.raises(RemoteTimelineError, match="stopped answering"):
        gone.anchor_s(0, 0, 1.0)
    gone.fetch_figures()  # no answer: the figures stay unknown
    assert gone.hook_s is None and gone.server_cpu_s is None and gone.hooks is None


def test_a_mark_never_waited_for_is_dropped_after_keep_steps() -> None:
    server, remote, _ = _pair()
    for token in range(KEEP_STEPS + 1):
        server.add(token)
    with pytest.raises(RemoteTimelineError, match="KeyError"):
        remote.wait(0)
    assert remote.wait(1).end_s == 1.0
    remote.connection.close()


def test_a_controller_told_to_run_in_its_own_process_says_which_class_does() -> None:
    from kdvfs.common.errors import KdvfsError
    from kdvfs.runtime.controller import Controller

    with pytest.raises(KdvfsError, match=r"use ProcessController\(config\)"):
        Controller("plan.json", "step.trace.json", own_process=True).__enter__()
