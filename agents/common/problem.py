"""The planning problem every decision maker solves, and the interface they share.

A :class:`Problem` is one training step (trace) on one GPU (profile) with a budget (the allowed step-time
increase over auto, a fraction) and a switching latency. A :class:`Planner` turns it into a
:class:`~kdvfs.envs.model.schedule.Schedule`; learned policies and exact planners alike, so ``kdvfs compare``
scores them the same way (:func:`score`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.cost_model import CostParams
from kdvfs.envs.model.cost_tables import build_tables
from kdvfs.envs.model.estimate import estimate_features
from kdvfs.envs.model.power_limits import PowerLimits, power_limits
from kdvfs.envs.model.schedule import ActionCosts, Outcome, Schedule, execute, replay
from kdvfs.envs.trace.trace import Trace, noncommunication_s, with_measured_gaps


class InfeasibleBudgetError(KdvfsError):
    """No schedule meets the time budget."""


@dataclass(frozen=True)
class Problem:
    """One step to schedule.

    Attributes:
        trace: the training step, every kernel with features (estimated where it had none).
        profile: the GPU.
        costs: time and energy of every kernel under every action.
        budget: allowed step-time increase over auto, as a fraction (0.01 = 1%).
        latency_s: switching latency the schedule is executed with (s).
        stall_s: GPU stall per clock change (s).
        power_limit_w: the power limit the step is priced at (W), or None for the one it was recorded under
            (:attr:`power_limits`).
    """

    trace: Trace
    profile: GpuProfile
    costs: ActionCosts
    budget: float
    latency_s: float
    stall_s: float
    power_limit_w: float | None = None

    @classmethod
    def build(cls, trace: Trace, profile: GpuProfile, budget: float, latency_s: float | None = None,
              power_limit_w: float | None = None) -> Problem:
        """Cost tables of ``trace`` on ``profile`` priced at ``power_limit_w`` (W; None: the limit it was recorded
        under; one outside the board's range raises :class:`~kdvfs.envs.model.power_limits.PowerLimitError`).
        Latency defaults to the profile's mean; a latency of 0 models ideal switching (no stall either)."""
        if budget < 0:
            raise KdvfsError(f"budget {budget} must be >= 0 (a fraction: 0.01 = 1%)")
        params = CostParams.from_profile(profile)
        trace = estimate_features(trace, profile)
        costs = ActionCosts.from_tables(build_tables(trace, profile, params, power_limit_w))
        latency = profile.switching.latency_mean_s if latency_s is None else latency_s
        return cls(trace, profile, costs, budget, latency, params.switch_stall_s if latency > 0 else 0.0,
                   power_limit_w)

    def with_budget(self, budget: float) -> Problem:
        """This problem with another budget (a fraction); the cost tables are shared."""
        return replace(self, budget=budget)

    @property
    def power_limits(self) -> PowerLimits:
        """The limit the step was recorded under and the one it is priced at, with their sources."""
        return power_limits(self.trace, self.profile, self.power_limit_w)

    @property
    def auto(self) -> Outcome:
        """The GPU's default behaviour: every kernel in auto mode at the highest memory clock."""
        return execute(self.costs, np.full(self.costs.kernels, self.costs.auto_index), 0.0, self.stall_s)

    @property
    def budget_s(self) -> float:
        """Largest allowed step time (s): auto's step time times (1 + budget)."""
        return self.auto.time_s * (1.0 + self.budget)


def rank_slack_s(trace: Trace) -> float:
    """Seconds a torchrun rank's step can grow without lengthening the job's step, from its capture's
    ``measurements``: the longest time outside communication kernels over the job's ranks
    (``job_max_noncommunication_s``) minus this rank's (:func:`~kdvfs.envs.trace.trace.noncommunication_s`),
    i.e. how much less it works between collectives than the busiest rank, which it waits for; 0 for a
    trace of one process."""
    measured = trace.meta.measurements
    busiest_s = measured.get("job_max_noncommunication_s")
    if measured.get("world_size", 1.0) <= 1 or busiest_s is None:
        return 0.0
    return max(0.0, busiest_s - noncommunication_s(trace))


def rank_budget(trace: Trace, budget: float) -> float:
    """A torchrun rank's budget over its own step (a fraction) under the job's ``budget``:
    ``(slack_s + budget * job_step_s) / step_s``: its step may grow by its slack (:func:`rank_slack_s`) plus
    the job's allowance, so its time outside collectives stays within the busiest rank's plus
    ``budget * job_step_s`` (the growth its waits absorb), and the job's step within ``job_step_s * (1 +
    budget)``. At least ``budget``; ``budget`` itself for a trace of one process."""
    measured = trace.meta.measurements
    if measured.get("world_size", 1.0) <= 1:
        return budget
    step_s = with_measured_gaps(trace).step_time_s
    job_s = measured.get("job_step_time_s", step_s)
    return max(budget, (rank_slack_s(trace) + budget * job_s) / step_s)


class Planner(Protocol):
    """Anything that schedules clocks for a step: ``plan`` returns an action per kernel."""

    name: str

    def plan(self, problem: Problem) -> Schedule: ...


@dataclass(frozen=True)
class Score:
    """A schedule executed with the problem's switching latency, relative to auto (percent)."""

    method: str
    energy_saved_pct: float
    slowdown_pct: float
    switches: int
    solve_s: float

    def as_json(self) -> dict[str, float | int | str]:
        return {"method": self.method, "energy_saved_pct": self.energy_saved_pct, "slowdown_pct": self.slowdown_pct,
                "switches": self.switches, "solve_s": self.solve_s}


def outcome_of(problem: Problem, schedule: Schedule, ideal: bool = False) -> Outcome:
    """What ``schedule`` costs: executed with the problem's latency and stalls, or as planned (``ideal``:
    every change on time and free). A reactive schedule already holds the clocks that ran."""
    if ideal:
        return execute(problem.costs, schedule.actions, 0.0, 0.0)
    if schedule.reactive:
        return replay(problem.costs, schedule.actions, problem.stall_s)
    return execute(problem.costs, schedule.actions, problem.latency_s, problem.stall_s)


BUDGET_TOLERANCE_PCT = 1e-6
"""Slowdown beyond the budget (percentage points) still counted as within it (rounding)."""


def within_budget(slowdown_pct: float, budget: float) -> bool:
    """Whether a slowdown (%) is within a budget (a fraction: 0.01 = 1%), to :data:`BUDGET_TOLERANCE_PCT`."""
    return slowdown_pct <= 100.0 * budget + BUDGET_TOLERANCE_PCT


def score(problem: Problem, schedule: Schedule, ideal: bool = False) -> Score:
    """Cost of ``schedule`` (see :func:`outcome_of`) relative to auto."""
    outcome = outcome_of(problem, schedule, ideal)
    auto = problem.auto
    return Score(schedule.method, 100.0 * (1.0 - outcome.energy_j / auto.energy_j),
                 100.0 * (outcome.time_s / auto.time_s - 1.0), outcome.switches, schedule.solve_s)
