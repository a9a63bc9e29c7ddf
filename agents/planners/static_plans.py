"""Plans that ignore switching latency: the paper's ILP (global and per kernel), the best single static
pair, and the per-phase (pass-level) plan. All are exact for their own problem."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from kdvfs.agents.common.problem import InfeasibleBudgetError, Problem
from kdvfs.agents.planners.mckp import solve_mckp
from kdvfs.common.arrays import Array
from kdvfs.envs.model.schedule import Schedule
from kdvfs.envs.trace.trace import Phase


def _infeasible(problem: Problem, what: str) -> InfeasibleBudgetError:
    return InfeasibleBudgetError(f"no {what} meets a {problem.budget:.2%} budget on "
                                 f"{problem.trace.meta.workload!r}; allow a larger --budget")


@dataclass
class IlpGlobal:
    """One action per kernel, minimum step energy, step time <= (1 + slowdown) x auto (exact MILP)."""

    name: str = "ilp"

    def plan(self, problem: Problem) -> Schedule:
        start = time.perf_counter()
        solution = solve_mckp(problem.costs.time_s, problem.costs.energy_j, problem.budget_s)
        if solution is None:
            raise _infeasible(problem, "per-kernel plan")
        return Schedule(solution.choice, self.name, time.perf_counter() - start,
                        {"gap_j": solution.energy_j - solution.lower_bound_j})


@dataclass
class PerKernelBudget:
    """Each kernel alone: its cheapest action within (1 + slowdown) x its auto time (the ILP's "local"
    mode; its constraints are separable, so the per-kernel minimum is the exact optimum)."""

    name: str = "greedy"

    def plan(self, problem: Problem) -> Schedule:
        start = time.perf_counter()
        costs = problem.costs
        limit = costs.time_s[:, costs.auto_index] * (1.0 + problem.budget)
        energy = np.where(costs.time_s <= limit[:, None] * (1 + 1e-12), costs.energy_j, np.inf)
        return Schedule(np.argmin(energy, axis=1), self.name, time.perf_counter() - start)


def _grouped(problem: Problem, groups: Array) -> tuple[Array, Array, Array]:
    """Summed (time, energy) of every action over each group of kernels: (G, A) each, plus group ids."""
    ids, inverse = np.unique(groups, return_inverse=True)
    time_s = np.zeros((len(ids), problem.costs.time_s.shape[1]))
    energy_j = np.zeros_like(time_s)
    np.add.at(time_s, inverse, problem.costs.time_s)
    np.add.at(energy_j, inverse, problem.costs.energy_j)
    return time_s, energy_j, inverse


def _plan_groups(problem: Problem, groups: Array, name: str, what: str) -> Schedule:
    start = time.perf_counter()
    time_s, energy_j, inverse = _grouped(problem, groups)
    solution = solve_mckp(time_s, energy_j, problem.budget_s)
    if solution is None:
        raise _infeasible(problem, what)
    return Schedule(solution.choice[inverse], name, time.perf_counter() - start)


@dataclass
class StaticPair:
    """The best single action for the whole step."""

    name: str = "static"

    def plan(self, problem: Problem) -> Schedule:
        return _plan_groups(problem, np.zeros(problem.costs.kernels, dtype=np.int64), self.name, "single clock pair")


@dataclass
class PerPhase:
    """One action per phase (forward, backward, optimizer, other): the paper's pass-level method."""

    name: str = "per-phase"

    def plan(self, problem: Problem) -> Schedule:
        phases = np.array([list(Phase).index(k.phase) for k in problem.trace.kernels])
        return _plan_groups(problem, phases, self.name, "per-phase plan")


@dataclass
class Auto:
    """The GPU's default behaviour: auto at the highest memory clock for every kernel."""

    name: str = "auto"

    def plan(self, problem: Problem) -> Schedule:
        return Schedule(np.full(problem.costs.kernels, problem.costs.auto_index), self.name)
