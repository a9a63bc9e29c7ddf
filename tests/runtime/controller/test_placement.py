"""The controller's thread following the training thread's CPU: real threads and real affinity calls."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kdvfs.runtime.controller.placement import TrainerCpu
from tests.runtime.controller_helpers import fake_controller, run_steps, write_plan

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")


def _in_thread(work: threading.Thread) -> None:
    work.start()
    work.join()


def test_a_thread_follows_the_cpu_another_marked() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    trainer_cpu, seen = TrainerCpu(), []

    def trainer(cpu: int) -> None:
        os.sched_setaffinity(0, {cpu})
        trainer_cpu.mark()

    def controller() -> set[int]:
        trainer_cpu.follow()
        return os.sched_getaffinity(0)

    with ThreadPoolExecutor(1) as trainer_thread, ThreadPoolExecutor(1) as controller_thread:  # one thread each
        for cpu in (allowed[-1], allowed[0], allowed[0]):
            trainer_thread.submit(trainer, cpu).result()
            seen.append(controller_thread.submit(controller).result())
    assert seen == [{allowed[-1]}, {allowed[0]}, {allowed[0]}]
    assert trainer_cpu.figures() == {"moves": 1 + (len(allowed) > 1), "cpu": allowed[0], "error": None}


def test_nothing_moves_before_a_mark_and_a_cpu_it_may_not_use_stops_the_following() -> None:
    trainer_cpu, seen = TrainerCpu(), []

    def controller() -> None:
        before = os.sched_getaffinity(0)
        trainer_cpu.follow()  # nothing marked yet
        seen.append(os.sched_getaffinity(0) == before)
        trainer_cpu._cpu = os.cpu_count() + 4096  # type: ignore[operator]  # no such CPU
        trainer_cpu.follow()
        seen.append(os.sched_getaffinity(0) == before)

    _in_thread(threading.Thread(target=controller))
    assert seen == [True, True]
    assert trainer_cpu.moves == 0 and "could not move the controller's thread" in str(trainer_cpu.error)


def test_the_controllers_thread_runs_on_the_training_threads_cpu(tmp_path: Path) -> None:
    controller, _, _ = fake_controller(write_plan(tmp_path / "plan.json"), follow_trainer_cpu=True)
    with controller:
        run_steps(controller, 6)
        controller.flush()
        issuer = controller._issuer
        assert issuer is not None and issuer.native_id is not None
        pinned = os.sched_getaffinity(issuer.native_id)
    assert controller.summary is not None
    figures = controller.summary["trainer_cpu"]
    assert figures["error"] is None and figures["moves"] >= 1 and pinned == {figures["cpu"]}
    default, _, _ = fake_controller(write_plan(tmp_path / "plan2.json"))
    with default:
        run_steps(default, 2)
    assert default.summary is not None and default.summary["trainer_cpu"] is None
