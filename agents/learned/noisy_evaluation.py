"""A frozen policy and every planner over seeded episodes with the environment's disturbances, on the same
draws (``kdvfs evaluate --episodes N --seed K``).

Per budget and episode, the policy runs closed-loop through ``KernelDVFS-v0`` with its settings and every
disturbance on (:meth:`kdvfs.envs.env.config.EnvConfig.with_disturbances`); each planner's fixed schedule,
planned once on the mean costs, runs open-loop through that episode's draws
(:func:`kdvfs.envs.env.dynamics.execute_open_loop`). Both are scored against auto under the same draws.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.evaluation.compare import plan_methods
from kdvfs.agents.learned.policy_planner import PolicyPlanner, policy_env, rollout
from kdvfs.agents.planners.registry import COMPARED
from kdvfs.envs.env.dynamics import Disturbances, execute_open_loop
from kdvfs.envs.model.schedule import ActionCosts, Schedule, replay

WITHIN_TOLERANCE_PCT = 1e-9
"""Slowdown above the budget (percentage points) still counted as within it (rounding)."""


@dataclass(frozen=True)
class NoisyRow:
    """One method at one budget over the episodes: means of its saving, slowdown and switches per step."""

    budget: float
    method: str
    energy_saved_pct: float
    slowdown_pct: float
    switches: float
    solve_s: float
    within_budget: float
    episodes: int

    def as_json(self) -> dict[str, float | int | str]:
        """``compare``'s fields (means), ``within_budget`` (fraction of episodes) and ``episodes``."""
        return {"method": self.method, "energy_saved_pct": self.energy_saved_pct, "slowdown_pct": self.slowdown_pct,
                "switches": self.switches, "solve_s": self.solve_s, "budget_pct": 100.0 * self.budget,
                "within_budget": self.within_budget, "episodes": self.episodes}


def tiled(costs: ActionCosts, times: int) -> ActionCosts:
    """``costs`` for a run of ``times`` consecutive repetitions of the step."""
    return ActionCosts(np.tile(costs.time_s, (times, 1)), np.tile(costs.energy_j, (times, 1)), costs.core_mhz,
                       costs.mem_mhz, costs.auto_index, costs.idle_power_w)


def _open_loop(costs: ActionCosts, schedule: Schedule, drawn: Disturbances, stall_s: float, times: int
               ) -> tuple[float, float, float]:
    """(energy saved %, slowdown %, switches per step) of ``schedule`` repeated ``times`` through ``drawn`` (a
    reactive schedule's clocks as they ran)."""
    actions, priced = np.tile(schedule.actions, times), drawn.apply(costs)
    if schedule.reactive:
        outcome = replay(priced, actions, stall_s)
    else:
        outcome = execute_open_loop(costs, actions, drawn, stall_s)
    auto = replay(priced, np.full(costs.kernels, costs.auto_index), stall_s)
    return (100.0 * (1.0 - outcome.energy_j / auto.energy_j), 100.0 * (outcome.time_s / auto.time_s - 1.0),
            outcome.switches / times)


def _row(budget: float, method: str, results: list[tuple[float, float, float]], solve_s: float) -> NoisyRow:
    saved, slowdown, switches = (np.array(column) for column in zip(*results, strict=True))
    within = float(np.mean(slowdown <= 100.0 * budget + WITHIN_TOLERANCE_PCT))
    return NoisyRow(budget, method, float(saved.mean()), float(slowdown.mean()), float(switches.mean()), solve_s,
                    within, len(results))


def noisy_rows(problem: Problem, planner: PolicyPlanner, budgets: Sequence[float], episodes: int, seed: int,
               methods: Sequence[str] = COMPARED, progress: Callable[[str], None] | None = None) -> list[NoisyRow]:
    """The policy's and every method's rows at each budget over ``episodes`` episodes seeded ``seed``,
    ``seed + 1``, ... (the same draws for all of them)."""
    rows = []
    for budget in budgets:
        case = problem.with_slowdown(budget)
        schedules = plan_methods(case, methods, progress)
        env = policy_env(planner.policy, case, disturbed=True)
        times = env.config.run_steps
        costs = tiled(case.costs, times)
        policy_results: list[tuple[float, float, float]] = []
        planner_results: dict[str, list[tuple[float, float, float]]] = {s.method: [] for s in schedules}
        rollout_s = 0.0
        for episode in range(episodes):
            if progress:
                progress(f"episode {episode + 1}/{episodes} @ {budget:.1%}")
            start = time.perf_counter()
            summary = rollout(planner.policy, env, {"step": 0, "budget": budget}, seed + episode)
            rollout_s += time.perf_counter() - start
            policy_results.append((summary["energy_saved_pct"], summary["slowdown_pct"], summary["switches"] / times))
            for schedule in schedules:
                planner_results[schedule.method].append(_open_loop(costs, schedule, env.disturbances,
                                                                   case.stall_s, times))
        rows.append(_row(budget, planner.name, policy_results, rollout_s / episodes))
        rows += [_row(budget, s.method, planner_results[s.method], s.solve_s) for s in schedules]
    return rows
