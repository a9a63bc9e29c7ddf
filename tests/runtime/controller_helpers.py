"""Shared setup of the controller tests: a small step on the H200 profile, its plan file, and a controller
on the cost-model fake GPU with a virtual clock."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.planners.registry import make_planner
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.drift import DriftModel
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.runtime.cli.offline.plan import schedule_json
from kdvfs.runtime.controller import Controller
from kdvfs.runtime.testing.fake_gpu import FakeGpu, FakeStepTimeline, VirtualClock

TRACE = "h200/gpt3xl-1layer-b4"
LATENCY_MS = 2.0
PLAN_BUDGET = 0.05


def small_problem(budget: float = PLAN_BUDGET) -> Problem:
    return Problem.build(open_trace(TRACE), load_profile("h200"), budget, LATENCY_MS / 1e3)


def write_plan(path: Path, method: str = "latency-optimal") -> Path:
    """A plan of the small step (``kdvfs plan`` format) at a 5% budget, 2 ms switching, its first segment at
    the last segment's clocks: these tests check in-step timing, and a plan whose step starts at other clocks
    than it ends needs a change at the step boundary, which the planners do not charge but the controller
    issues one latency before the step ends (the fake GPU then runs the last kernels at the next step's clocks
    and charges a stall)."""
    problem = small_problem()
    schedule = make_planner(method).plan(problem)
    actions = np.array(schedule.actions)
    first_end = int(np.argmax(actions != actions[0])) if (actions != actions[0]).any() else len(actions)
    actions[:first_end] = actions[-1]
    path.write_text(json.dumps(schedule_json(problem, replace(schedule, actions=actions))))
    return path


def fake_controller(policy: Path, permission: bool = True, drift: DriftModel | None = None, **options: Any
                    ) -> tuple[Controller, FakeGpu, FakeStepTimeline]:
    """A controller on a fake H200 running the small step (with ``drift``: drifting and noisy); options
    override the test defaults."""
    problem = small_problem()
    clock = VirtualClock()
    gpu = FakeGpu(problem.costs, problem.profile, problem.latency_s, problem.stall_s, clock, permission, drift)
    timeline = FakeStepTimeline(gpu, clock)
    settings: dict[str, Any] = {"latency_ms": LATENCY_MS, "budget": PLAN_BUDGET, "window_steps": 5,
                                "window_s": 0.1, "energy_read_every_s": 0.0, "issue_early_ms": 0.0, "ab_share": 0.0,
                                **options}
    controller = Controller(str(policy), TRACE, device=gpu, timeline=timeline, clock=clock, **settings)
    return controller, gpu, timeline


def run_steps(controller: Controller, steps: int) -> None:
    """Mark ``steps`` training steps, letting the controller's thread handle each before the next."""
    for _ in range(steps):
        controller.step()
        controller.flush()


def log_records(path: Path, event: str) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == event]
