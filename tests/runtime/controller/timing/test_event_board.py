"""The GPU timeline on the event board: the recorder files marks and anchors by step, the native poller writes when
the fake GPU passed each (in stream order, without the interpreter lock), and the timeline reads step ends, anchors
and the host's pace from the board, in this process or mapped by another; the host's marks stand in without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kdvfs.common.paths import REPO_ROOT
from kdvfs.runtime.controller.timing import gpu_timeline
from kdvfs.runtime.controller.timing.gpu_events import recorder as recorder_module
from kdvfs.runtime.controller.timing.gpu_events.board import (
    ANCHOR_SLOTS,
    ANCHORS,
    ANCHORS_PASSED,
    HOOK_S,
    MARK_SLOTS,
    MARKS_PASSED,
    POLLER_CPU_S,
    POLLS,
    EventBoard,
)
from kdvfs.runtime.controller.timing.gpu_events.recorder import (
    CPU_SAMPLE_ANCHORS,
    MAX_ANCHORS_PER_STEP,
    EventRecorder,
    HostRecorder,
)
from kdvfs.runtime.controller.timing.gpu_timeline import BoardTimeline, TimelineError
from kdvfs.runtime.device.host_time import RealClock
from kdvfs.runtime.testing.fake_cuda_events import FakeCudaEvents


@pytest.fixture
def gpu() -> FakeCudaEvents:
    return FakeCudaEvents()


@pytest.fixture
def timeline(gpu: FakeCudaEvents) -> Iterator[BoardTimeline]:
    board = EventBoard.local()
    line = BoardTimeline(board, RealClock(), EventRecorder(board, gpu.calls(), gpu.new_event, lambda: None,
                                                           lambda: 3 * int(board.ints[1])))
    yield line
    line.stop()


def _anchor(timeline: BoardTimeline) -> None:
    assert isinstance(timeline.recorder, EventRecorder)
    timeline.recorder.anchor()


def _until(condition: Any, timeout_s: float = 10.0) -> bool:
    ends_s = time.perf_counter() + timeout_s
    while not condition():
        if time.perf_counter() > ends_s:
            return False
        time.sleep(0.001)
    return True


def test_steps_end_with_their_anchors_at_the_gpus_times(gpu: FakeCudaEvents, timeline: BoardTimeline) -> None:
    first = timeline.mark()  # ends step 0
    gpu.gpu_s = 0.01
    _anchor(timeline)
    gpu.gpu_s = 0.02
    _anchor(timeline)
    gpu.gpu_s = 0.1
    second = timeline.mark()  # ends step 1, which holds the two anchors
    assert (first, second) == (0, 1)
    start = timeline.wait(first)
    assert start.anchors_s == () and start.duration_s is None and start.signature is None
    end = timeline.wait(second)
    assert end.duration_s == pytest.approx(0.1) and end.signature == 3  # allocations since the previous mark
    assert np.diff([*end.anchors_s, end.end_s]) == pytest.approx([0.01, 0.08])
    assert timeline.anchor_s(1, 1, time.perf_counter()) == pytest.approx(end.anchors_s[1])  # still on the board
    now_s = time.perf_counter()
    assert timeline.anchor_s(2, 0, now_s) is None  # not recorded by the deadline
    gpu.gpu_s = 0.15
    threading.Timer(0.05, _anchor, (timeline,)).start()
    assert timeline.anchor_s(2, 0, now_s + 10) == pytest.approx(end.end_s + 0.05)  # recorded while it waits
    closing = threading.Timer(0.05, timeline.mark)
    closing.start()
    started_s = time.perf_counter()
    assert timeline.anchor_s(2, 1, started_s + 10) is None  # the step ended without a second anchor
    assert time.perf_counter() - started_s < 5
    closing.join()
    assert timeline.board.floats[POLLER_CPU_S] > 0 and timeline.board.ints[POLLS] > 0 and timeline.hook_s > 0


def test_the_last_passed_anchor_is_seen_while_its_step_is_recorded_and_after(gpu: FakeCudaEvents,
                                                                             timeline: BoardTimeline) -> None:
    end = timeline.wait(timeline.mark())  # step 0 ends; step 1 is being recorded
    gpu.passed_s = 0.02  # the GPU has not reached the second anchor yet
    for gpu.gpu_s in (0.01, 0.03, 0.04):
        _anchor(timeline)
    assert _until(lambda: timeline.board.ints[ANCHORS_PASSED] == 1)
    passed = timeline.passed_anchor(1, -1)
    assert passed is not None and passed[0] == 0 and passed[1] == pytest.approx(end.end_s + 0.01)
    assert timeline.passed_anchor(1, 0) is None  # none since the last one seen
    assert timeline.passed_anchor(2, -1) is None  # a step not yet begun
    gpu.passed_s = 0.035
    assert _until(lambda: timeline.board.ints[ANCHORS_PASSED] == 2)
    assert timeline.passed_anchor(1, 0) == (1, pytest.approx(end.end_s + 0.03))
    gpu.gpu_s = 0.05
    timeline.mark()  # step 1 ends while the GPU is still short of its last anchor
    time.sleep(0.01)
    assert timeline.board.ints[MARKS_PASSED] == 1
    assert timeline.passed_anchor(1, 0) == (1, pytest.approx(end.end_s + 0.03))
    gpu.passed_s = float("inf")
    ended = timeline.wait(1)
    assert np.diff([*ended.anchors_s, ended.end_s]) == pytest.approx([0.02, 0.01, 0.01])


def test_the_poller_passes_items_in_stream_order(gpu: FakeCudaEvents, timeline: BoardTimeline) -> None:
    """An anchor the GPU has not passed (another stream's, say) holds back the mark and anchors after it: a step
    ends only with its anchors' times."""
    timeline.wait(timeline.mark())
    gpu.gpu_s = 0.5
    _anchor(timeline)  # recorded at 0.5, beyond what the GPU passed
    gpu.passed_s, gpu.gpu_s = 0.2, 0.1
    _anchor(timeline)
    timeline.mark()
    time.sleep(0.02)
    assert timeline.board.ints[ANCHORS_PASSED] == 0 and timeline.board.ints[MARKS_PASSED] == 1
    gpu.passed_s = 1.0
    end = timeline.wait(1, time.perf_counter() + 0.01)
    assert np.diff([*end.anchors_s, end.end_s]) == pytest.approx([-0.4, 0.0])


def test_the_hosts_pace_comes_from_the_hooks_host_times(monkeypatch: pytest.MonkeyPatch, gpu: FakeCudaEvents,
                                                        timeline: BoardTimeline) -> None:
    """Six hooks 2 ms apart on the host, then one 40 ms later (the host waited for the GPU): the step's pace is
    2 ms, whatever the GPU's times; a step of three hooks has none."""
    host = {"s": 100.0}

    class HostTime:
        thread_time = staticmethod(time.thread_time)

        @staticmethod
        def perf_counter() -> float:
            return host["s"]

    first = timeline.mark()
    monkeypatch.setattr(recorder_module, "time", HostTime)
    for gap_s in (0.0, 0.002, 0.002, 0.002, 0.002, 0.002, 0.04):
        host["s"] += gap_s
        gpu.gpu_s += 0.01  # the GPU's own pace differs
        _anchor(timeline)
    second = timeline.mark()
    for _ in range(3):
        _anchor(timeline)
    third = timeline.mark()
    monkeypatch.undo()
    assert timeline.wait(first).host_pace_s is None
    assert timeline.wait(second).host_pace_s == pytest.approx(0.002)
    assert timeline.wait(third).host_pace_s is None


class ThreadClock:
    """``time.thread_time``: ``read_s`` a read, and whatever :meth:`spend` adds between reads."""

    def __init__(self, read_s: float) -> None:
        self.now_s, self.read_s, self.calls = 0.0, read_s, 0

    def spend(self, seconds: float) -> None:
        self.now_s += seconds

    def __call__(self) -> float:
        self.calls += 1
        self.now_s += self.read_s
        return self.now_s


def test_one_anchor_in_sixteen_counts_the_cpu_of_all_less_what_counting_adds(monkeypatch: pytest.MonkeyPatch,
                                                                             gpu: FakeCudaEvents) -> None:
    """The hooks' CPU (``HOOK_S``) from every ``CPU_SAMPLE_ANCHORS``-th anchor's, times that many, less the cost of
    the two reads that measure it (a thread clock of 1 us a read; each anchor's own work, its event's record, 4 us)."""
    clock = ThreadClock(1e-6)

    def working_event() -> Any:
        event = gpu.new_event()
        record = event.record
        event.record = lambda stream=None: (record(stream), clock.spend(4e-6))  # type: ignore[method-assign]
        return event

    monkeypatch.setattr(recorder_module.time, "thread_time", clock)
    board = EventBoard.local()
    recorder = EventRecorder(board, gpu.calls(), working_event, lambda: None, None)
    recorder.anchor()  # the first starts the poller
    board.floats[HOOK_S], before = 0.0, clock.calls
    for _ in range(2 * CPU_SAMPLE_ANCHORS):
        recorder.anchor()
    recorder.stop()
    assert clock.calls - before == 4  # two anchors counted, two reads each
    assert board.floats[HOOK_S] == pytest.approx(2 * CPU_SAMPLE_ANCHORS * 4e-6)


def test_a_ring_behind_drops_the_rest_of_the_step_and_a_lapped_step_is_an_error(gpu: FakeCudaEvents,
                                                                                 timeline: BoardTimeline) -> None:
    board = timeline.board
    gpu.passed_s = -1.0  # the GPU passes nothing
    for anchors in (MAX_ANCHORS_PER_STEP + 5, MAX_ANCHORS_PER_STEP - 10, 20):
        for _ in range(anchors):
            _anchor(timeline)
        timeline.mark()
    assert board.ints[ANCHORS] == ANCHOR_SLOTS  # a step's anchors past its most, or a whole ring behind, dropped
    assert list(board.mark_anchors[:3]) == [MAX_ANCHORS_PER_STEP, ANCHOR_SLOTS - 10, ANCHOR_SLOTS]
    gpu.passed_s = float("inf")
    assert _until(lambda: board.ints[ANCHORS_PASSED] == ANCHOR_SLOTS)
    _anchor(timeline)  # the ring free again, a new step records
    assert board.ints[ANCHORS] == ANCHOR_SLOTS + 1
    for _ in range(MARK_SLOTS):
        timeline.mark()
    with pytest.raises(TimelineError, match="fell 128 steps behind"):
        timeline.wait(1)


def test_another_process_maps_the_same_board() -> None:
    board = EventBoard.shared()
    assert board.fd is not None
    other = EventBoard.attach(os.dup(board.fd))  # what the controller process does with the inherited memfd
    board.close_fd()
    board.close_fd()
    board.ints[ANCHORS], board.anchor_gpu_s[7] = 3, 1.5
    assert other.ints[ANCHORS] == 3 and other.anchor_gpu_s[7] == 1.5


def test_without_cuda_the_hosts_marks_stand_in() -> None:
    """``cpu_test_mode``: a step ends when the training thread marks it, its duration the thread's CPU time."""
    host, cpu = {"s": 10.0}, {"s": 1.0}
    board = EventBoard.local()
    timeline = BoardTimeline(board, RealClock(), HostRecorder(board, lambda: host["s"], lambda: cpu["s"]))
    first = timeline.mark()
    host["s"], cpu["s"] = 12.0, 1.25
    second = timeline.mark()
    assert timeline.wait(first).end_s == 10.0 and timeline.wait(first).duration_s is None
    end = timeline.wait(second)
    assert (end.end_s, end.duration_s, end.anchors_s, end.signature) == (12.0, 0.25, (), None)
    assert timeline.passed_anchor(1, -1) is None and timeline.anchor_s(1, 0, 0.0) is None
    timeline.stop()


@pytest.mark.parametrize("shared", [False, True], ids=["local", "shared"])
def test_a_forked_child_leaves_its_parents_poller_and_board_alone(gpu: FakeCudaEvents, shared: bool) -> None:
    """A DataLoader worker forked mid-run (say) that stops the recorder at its exit does not stop the parent's
    poller, even on a shared board; its writes on a local board stay its own."""
    board = EventBoard.shared() if shared else EventBoard.local()
    recorder = EventRecorder(board, gpu.calls(), gpu.new_event, lambda: None, None)
    timeline = BoardTimeline(board, RealClock(), recorder)
    timeline.wait(timeline.mark())
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        timeline.stop()
        if not shared:
            board.ints[ANCHORS] = 99
        os._exit(0)
    assert os.waitpid(child, 0)[1] == 0
    assert recorder.poller is not None and recorder.poller.is_alive() and board.ints[ANCHORS] == 0
    timeline.mark()
    assert timeline.wait(1).duration_s == pytest.approx(0.0)
    timeline.stop()
    board.close_fd()


def test_a_wait_on_a_stopped_poller_is_an_error(monkeypatch: pytest.MonkeyPatch, gpu: FakeCudaEvents,
                                                timeline: BoardTimeline) -> None:
    """The poller gone (its process ended, say) while the GPU has not passed the step: the wait raises (the
    controller's thread then returns the GPU to auto) rather than waiting for ever."""
    monkeypatch.setattr(gpu_timeline, "STALL_S", 0.2)
    timeline.wait(timeline.mark())
    gpu.passed_s = -1.0
    timeline.mark()
    timeline.stop()
    started_s = time.perf_counter()
    with pytest.raises(TimelineError, match="made no poll"):
        timeline.wait(1)
    assert time.perf_counter() - started_s < 5


READER = """
import json, os, sys, socket
from multiprocessing.connection import Connection
from kdvfs.runtime.controller.control.remote_timeline import RemoteTimeline
from kdvfs.runtime.controller.timing.gpu_events.board import EventBoard
from kdvfs.runtime.device.host_time import RealClock
ours, _ = socket.socketpair()
timeline = RemoteTimeline(EventBoard.attach(int(sys.argv[1])), RealClock(), Connection(ours.detach()), 1)
ends = [timeline.wait(timeline.mark()) for _ in range(2)]
print(json.dumps({"anchors_s": ends[1].anchors_s, "end_s": ends[1].end_s, "duration_s": ends[1].duration_s,
                  "passed": timeline.passed_anchor(1, 0)}))
"""


def test_a_controller_process_reads_what_the_training_processs_poller_wrote() -> None:
    """The own-process path end to end on the fake GPU: the recorder and poller here, on a shared board; another
    interpreter maps its memfd and reads step 1's end and anchors as this process's timeline would."""
    gpu = FakeCudaEvents()
    board = EventBoard.shared()
    assert board.fd is not None
    timeline = BoardTimeline(board, RealClock(), EventRecorder(board, gpu.calls(), gpu.new_event, lambda: None, None))
    reader = subprocess.Popen([sys.executable, "-c", READER, str(board.fd)], pass_fds=[board.fd],
                              stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    board.close_fd()
    timeline.mark()
    for gpu.gpu_s in (0.01, 0.03):
        _anchor(timeline)
    gpu.gpu_s = 0.1
    timeline.mark()
    out, _ = reader.communicate(timeout=60)
    here = timeline.wait(1)
    timeline.stop()
    there = json.loads(out)
    assert there["anchors_s"] == pytest.approx(here.anchors_s) and there["end_s"] == pytest.approx(here.end_s)
    assert there["duration_s"] == pytest.approx(0.1) and there["passed"] == [1, pytest.approx(here.anchors_s[1])]
