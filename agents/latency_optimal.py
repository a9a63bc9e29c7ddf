"""The latency-aware optimum: the cheapest piecewise-constant clock schedule under switching latency.

A schedule is a sequence of segments of consecutive kernels, each run at one action. Clock changes happen
between segments; two changes closer than the switching latency L cannot both take effect on time, so
when there is more than one segment every segment must last at least L at its own action (idle gaps
included). Each change stalls the GPU for ``stall_s`` (see ``envs.schedule`` for the step boundary).
Minimise step energy subject to step time <= budget.

Method: Lagrangian relaxation of the time budget. For a multiplier lam >= 0, the minimum of
energy + lam * time over all valid segmentations is an exact dynamic programme over segment ends:

    F[k] = min_a min_{j <= J(k, a)} F[j] - C[j, a] + C[k, a] + switch(j)

with C the prefix sums of (energy + lam * time) per action and J(k, a) the last segment start that keeps
the segment [j, k) at least L long; a running prefix minimum over j makes it O(K * A) per lam. Bisection
on lam finds the cheapest schedule within the budget; ``info["gap_j"]`` certifies how far it can be from
the true constrained optimum (energy minus the best Lagrangian lower bound; 0 means proven optimal).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agents.problem import InfeasibleBudgetError, Problem
from envs.cost_model import Array
from envs.schedule import ActionCosts, Schedule, switch_points


@dataclass(frozen=True)
class _Solution:
    actions: Array
    time_s: float
    energy_j: float
    lagrangian: float


def _segment_starts(cum_time: Array, latency_s: float) -> Array:
    """J[k, a]: the last j with cum_time[k, a] - cum_time[j, a] >= latency (-1 if none). Shape (K+1, A)."""
    starts = np.empty(cum_time.shape, dtype=np.int64)
    for action in range(cum_time.shape[1]):
        column = cum_time[:, action]
        starts[:, action] = np.searchsorted(column, column - latency_s, side="right") - 1
    return starts


def _solve_lagrangian(costs: ActionCosts, lam: float, latency_s: float, stall_s: float,
                      starts: Array, cum_time: Array) -> _Solution:
    kernels, actions = costs.time_s.shape
    cum_cost = np.vstack([np.zeros(actions), np.cumsum(costs.energy_j + lam * costs.time_s, axis=0)])
    switch = stall_s * (costs.idle_power_w + lam)
    best = np.full(kernels + 1, np.inf)
    best[0] = 0.0
    prefix_min = np.full((kernels + 1, actions), np.inf)
    prefix_arg = np.zeros((kernels + 1, actions), dtype=np.int64)
    prefix_min[0] = -cum_cost[0]
    choice = np.zeros((kernels + 1, 2), dtype=np.int64)
    columns = np.arange(actions)
    for k in range(1, kernels + 1):
        valid = starts[k] >= 0
        j = np.where(valid, starts[k], 0)
        candidates = np.where(valid, prefix_min[j, columns] + cum_cost[k], np.inf)
        action = int(np.argmin(candidates))
        best[k] = candidates[action]
        choice[k] = (prefix_arg[j[action], action], action)
        entry = best[k] - cum_cost[k] + switch
        better = entry < prefix_min[k - 1]
        prefix_min[k] = np.where(better, entry, prefix_min[k - 1])
        prefix_arg[k] = np.where(better, k, prefix_arg[k - 1])
    single = int(np.argmin(cum_cost[kernels]))
    single_is_best = cum_cost[kernels, single] <= best[kernels]
    plan = np.full(kernels, single) if single_is_best else _backtrack(choice, kernels)
    rows = np.arange(kernels)
    entered = plan[switch_points(plan)]
    time_s = float(costs.time_s[rows, plan].sum() + stall_s * len(entered))
    energy = float(costs.energy_j[rows, plan].sum() + stall_s * costs.idle_power_w[entered].sum())
    return _Solution(plan, time_s, energy, energy + lam * time_s)


def _backtrack(choice: Array, kernels: int) -> Array:
    plan = np.empty(kernels, dtype=np.int64)
    end = kernels
    while end > 0:
        start, action = choice[end]
        plan[start:end] = action
        end = start
    return plan


def segments_ok(costs: ActionCosts, actions: Array, latency_s: float) -> bool:
    """True if every segment of a multi-segment schedule lasts at least ``latency_s``."""
    bounds = np.r_[0, np.flatnonzero(actions[1:] != actions[:-1]) + 1, len(actions)]
    if len(bounds) == 2:
        return True
    rows = np.arange(len(actions))
    durations = np.add.reduceat(costs.time_s[rows, actions], bounds[:-1])
    return bool(np.all(durations >= latency_s - 1e-12))


@dataclass
class LatencyOptimal:
    """The latency-aware optimum (see the module docstring). ``tolerance`` stops the bisection on lam."""

    name: str = "latency-optimal"
    iterations: int = 40

    def plan(self, problem: Problem) -> Schedule:
        start = time.perf_counter()
        costs, budget = problem.costs, problem.budget_s
        cum_time = np.vstack([np.zeros(costs.time_s.shape[1]), np.cumsum(costs.time_s, axis=0)])
        starts = _segment_starts(cum_time, problem.latency_s)

        def solve(lam: float) -> _Solution:
            return _solve_lagrangian(costs, lam, problem.latency_s, problem.stall_s, starts, cum_time)

        feasible, bound = self._search(solve, budget, problem)
        info = {"lambda_j_per_s": feasible[1], "gap_j": max(0.0, feasible[0].energy_j - bound)}
        return Schedule(feasible[0].actions, self.name, time.perf_counter() - start, info)

    def _search(self, solver: Callable[[float], _Solution], budget: float,
                problem: Problem) -> tuple[tuple[_Solution, float], float]:
        """Bisection on lam: the cheapest feasible solution found and the best Lagrangian lower bound."""
        low, high = 0.0, 1.0
        first = solver(low)
        bound = first.lagrangian - low * budget
        if first.time_s <= budget:
            return (first, low), bound
        best = solver(high)
        while best.time_s > budget:
            if high > 1e9:
                raise InfeasibleBudgetError(f"no schedule meets a {problem.slowdown:.2%} slowdown budget with "
                                            f"{problem.latency_s * 1e3:g} ms switching; allow a larger --slowdown")
            low, high = high, high * 4.0
            best = solver(high)
        bound = max(bound, best.lagrangian - high * budget)
        feasible = (best, high)
        for _ in range(self.iterations):
            middle = 0.5 * (low + high)
            candidate = solver(middle)
            bound = max(bound, candidate.lagrangian - middle * budget)
            if candidate.time_s <= budget:
                high = middle
                if candidate.energy_j < feasible[0].energy_j:
                    feasible = (candidate, middle)
            else:
                low = middle
        return feasible, bound
