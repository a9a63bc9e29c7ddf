"""The latency-aware optimum: the cheapest piecewise-constant clock schedule under switching latency.

A schedule is a sequence of segments of consecutive kernels, each run at one action. Clock changes happen
between segments; two changes closer than the switching latency L cannot both take effect on time, so
when there is more than one segment every segment must last at least L at its own action (idle gaps
included). Each change stalls the GPU for ``stall_s`` (see ``kdvfs.envs.model.schedule`` for the step boundary).
Minimise step energy subject to step time <= budget.

Method: Lagrangian relaxation of the time budget. For a multiplier lam >= 0, the minimum of
energy + lam * time over all valid segmentations is an exact dynamic programme
(:func:`kdvfs.envs.model.segment_plans.segment_plans`, O(K * A) per lam). Bisection on lam finds the cheapest schedule
within the budget; ``info["gap_j"]`` certifies how far it can be from the true constrained optimum (energy
minus the best Lagrangian lower bound; 0 means proven optimal).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from kdvfs.agents.common.problem import InfeasibleBudgetError, Problem
from kdvfs.envs.model.schedule import Schedule
from kdvfs.envs.model.segment_plans import cheapest_within, segment_starts


@dataclass
class LatencyOptimal:
    """The latency-aware optimum (see the module docstring); ``iterations`` bisection steps on lam."""

    name: str = "latency-optimal"
    iterations: int = 40

    def plan(self, problem: Problem) -> Schedule:
        start = time.perf_counter()
        costs = problem.costs
        starts = segment_starts(costs.time_s, problem.latency_s)
        found = cheapest_within(costs, np.array([problem.budget_s]), problem.stall_s, starts, self.iterations)
        if not found.feasible[0]:
            raise InfeasibleBudgetError(f"no schedule meets a {problem.budget:.2%} budget with "
                                        f"{problem.latency_s * 1e3:g} ms switching; allow a larger --budget")
        info = {"lambda_j_per_s": float(found.prices_j_per_s[0]),
                "gap_j": max(0.0, float(found.energy_j[0] - found.lower_bounds_j[0]))}
        return Schedule(found.plans[0], self.name, time.perf_counter() - start, info)
