"""The online policy in its own process: the same decisions as on the controller's thread, and a process
that dies stops the controller with the GPU back at auto."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from kdvfs.agents.learned.frozen import FrozenPolicy
from kdvfs.agents.learned.online import OnlinePolicy, kernel_at
from kdvfs.agents.learned.policy_planner import shipped_policy_path
from kdvfs.envs.common.errors import KdvfsError
from kdvfs.envs.env.live import LiveState
from kdvfs.runtime.controller.decider import DeciderError, DeciderProcess, write_holding_lock
from tests.runtime.controller_helpers import fake_controller, log_records, run_steps, small_problem

POLICY = shipped_policy_path("h200")


@pytest.mark.parametrize("warm_s", [0.0, 0.5e-3])
def test_the_process_decides_exactly_as_the_policy_on_this_thread(warm_s: float) -> None:
    problem = small_problem()
    policy = FrozenPolicy.load(POLICY, problem.profile)
    here, there = OnlinePolicy(policy, problem), DeciderProcess.started(policy, problem, warm_s)
    try:
        rng = np.random.default_rng(0)
        for budget in (0.01, 0.0, 0.02):
            assert here.begin(budget) == there.begin(budget)
            for now_s in np.sort(rng.uniform(0, here.auto_time_s, 40)):
                kernel = kernel_at(here.cumulative_s[:, 0].tolist(), 0, float(now_s))
                auto_s = float(here.cumulative_s[kernel, 0])
                pending = int(rng.integers(-1, 3))
                state = LiveState(kernel, int(rng.integers(3)), pending, 1e-4 if pending >= 0 else 0.0,
                                  float(now_s) * rng.uniform(1.0, 1.02), auto_s, rng.uniform(0.5, 2), rng.normal())
                there.expect(1e-3)  # with a warm lead it warms up at its last state and polls: no other effect
                time.sleep(1.5e-3)
                assert here.decide(state, float(now_s)) == there.decide(state, float(now_s))
                if pending < 0:  # as a controller does after an evaluation, now and then
                    assert here.look_ahead(3) == there.look_ahead(3)
        assert len(there.compute_us) == 3 * 40 and min(there.compute_us) > 0  # each decision's time in the child
        # With a lead it polled for the decisions after the first (no state to warm at yet), but where the loaded
        # host ran it after the request came; never without one.
        polled = np.array(there.spin_us) > 0
        assert polled[1:].mean() > 0.8 if warm_s else not polled.any()
    finally:
        there.close()


def test_a_write_holding_the_lock_goes_whole_or_fails_on_a_full_pipe() -> None:
    read_fd, write_fd = os.pipe()
    try:
        write_holding_lock(write_fd, b"request")
        assert os.read(read_fd, 64) == b"request"
        os.set_blocking(write_fd, False)
        with pytest.raises(BlockingIOError):  # nobody reads: the pipe fills, and the write fails, never blocks
            for _ in range(1 << 20):
                write_holding_lock(write_fd, bytes(64))
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_decider_that_died_raises_a_decider_error() -> None:
    problem = small_problem()
    decider = DeciderProcess.started(FrozenPolicy.load(POLICY, problem.profile), problem)
    decider.begin(0.01)
    decider.close()
    try:
        decider.begin(0.01)
    except DeciderError as error:
        assert "ended" in str(error)
    else:
        raise AssertionError("no DeciderError")


def test_a_killed_decider_stops_the_controller_and_the_gpu_goes_back_to_auto(tmp_path: Path) -> None:
    controller, gpu, _ = fake_controller(POLICY, log=str(tmp_path / "run.jsonl"), online_process=True)
    with controller:
        run_steps(controller, 25)
        (child,) = _decider_processes()
        os.kill(child, signal.SIGKILL)
        run_steps(controller, 25)
    summary = controller.summary
    assert summary is not None and "online decision process ended" in (summary["error"] or "")
    assert gpu.set_calls[-1].name == "reset_clocks" and summary["gpu_restored"]
    assert log_records(tmp_path / "run.jsonl", "error")


def _decider_processes() -> list[int]:
    """PIDs of this process's children running the decider (Linux ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().split(")")[-1].split()[1]) == os.getpid() \
                    and b"kdvfs.runtime.controller.decider" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_decisions_on_the_controllers_thread_by_default(tmp_path: Path) -> None:
    controller, gpu, _ = fake_controller(POLICY)
    with controller:
        run_steps(controller, 40)
        assert _decider_processes() == []
    summary = controller.summary
    assert summary is not None and summary["online_decisions"] > 0 and summary["error"] is None
    assert summary["online"]["decider_us"] is None and gpu.set_calls[-1].name == "reset_clocks"


def test_a_controller_that_fails_to_open_leaves_no_decider_behind() -> None:
    """The child starts before the plan is built (it imports meanwhile): a plan that cannot be built for
    this GPU (a B200 policy on the fake H200) ends it with the error."""
    controller, _, _ = fake_controller(shipped_policy_path("b200"), online_process=True)
    try:
        with controller:
            raise AssertionError("a B200 policy opened on an H200")
    except KdvfsError as error:
        assert "b200" in str(error).lower()
    assert _decider_processes() == []
