"""A frozen policy and every planner over seeded episodes with the environment's disturbances, on the same
draws (``kdvfs evaluate --episodes N --seed K``).

Per budget and episode the policy runs closed-loop through ``KernelDVFS-v0`` with every disturbance on
(:meth:`kdvfs.envs.env.config.EnvConfig.with_disturbances`); each planner's fixed schedule, planned once on the
mean costs, runs open-loop through that episode's draws (:func:`kdvfs.envs.env.dynamics.execute_open_loop`);
both are scored against auto under the same draws. Two more rows: ``latency-optimal+margin``, the latency-aware
optimum planned for each of ``MARGINS`` x the budget and executed on the same draws, the one saving the most
among those within budget in at least ``COMPLIANCE`` of the episodes (chosen on the evaluation's own draws,
which flatters it; ``planned_budget_pct`` says which); and ``fitting-plan``, the closed-loop rule the policy
can follow, run through the environment like the policy (:mod:`kdvfs.agents.learned.training.imitation`'s
``fitting_plan`` expert).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kdvfs.agents.common.problem import Problem, within_budget
from kdvfs.agents.evaluation.compare import plan_methods
from kdvfs.agents.learned.policy.policy_planner import Actor, PolicyPlanner, policy_env, rollout
from kdvfs.agents.learned.training.imitation import Expert
from kdvfs.agents.planners.registry import COMPARED
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.dynamics import Disturbances, execute_open_loop
from kdvfs.envs.model.schedule import ActionCosts, Schedule, replay

COMPLIANCE = 0.95
"""Share of episodes within budget that a schedule needs to count as staying within it."""
MARGINS = (0.25, 0.5, 0.625, 0.75, 0.875, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)
"""Multiples of the budget the margin-tuned optimum is planned for."""
MARGIN_METHOD = "latency-optimal+margin"
Result = tuple[float, float, float]
"""One episode of one method: energy saved (%), slowdown (%), switches per step."""
RULE_METHOD = "fitting-plan"


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
    planned_budget: float | None = None

    def as_json(self) -> dict[str, float | int | str]:
        """``compare``'s fields (means), ``within_budget`` (fraction of episodes), ``episodes`` and
        ``planned_budget_pct`` (the budget the schedule was planned for: the row's own but for the margin-tuned
        optimum)."""
        planned = self.budget if self.planned_budget is None else self.planned_budget
        return {"method": self.method, "energy_saved_pct": self.energy_saved_pct, "slowdown_pct": self.slowdown_pct,
                "switches": self.switches, "solve_s": self.solve_s, "budget_pct": 100.0 * self.budget,
                "within_budget": self.within_budget, "episodes": self.episodes, "planned_budget_pct": 100.0 * planned}


def tiled(costs: ActionCosts, times: int) -> ActionCosts:
    """``costs`` for a run of ``times`` consecutive repetitions of the step."""
    return ActionCosts(np.tile(costs.time_s, (times, 1)), np.tile(costs.energy_j, (times, 1)), costs.core_mhz,
                       costs.mem_mhz, costs.auto_index, costs.idle_power_w)


def _open_loop(costs: ActionCosts, schedule: Schedule, drawn: Disturbances, stall_s: float, times: int
               ) -> Result:
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


def _row(budget: float, method: str, results: list[Result], solve_s: float,
         planned_budget: float | None = None) -> NoisyRow:
    saved, slowdown, switches = (np.array(column) for column in zip(*results, strict=True))
    within = float(np.mean([within_budget(float(s), budget) for s in slowdown]))
    return NoisyRow(budget, method, float(saved.mean()), float(slowdown.mean()), float(switches.mean()), solve_s,
                    within, len(results), planned_budget)


def _margin_row(case: Problem, draws: Sequence[Disturbances], times: int) -> NoisyRow | None:
    """The margin-tuned latency-aware optimum at ``case``'s budget (module docstring) over ``draws``; None if
    no multiple stays within budget often enough."""
    costs, best = tiled(case.costs, times), None
    for margin in MARGINS:
        planned = case.with_budget(case.budget * margin)
        schedules = plan_methods(planned, ["latency-optimal"])
        if not schedules:
            continue
        results = [_open_loop(costs, schedules[0], drawn, case.stall_s, times) for drawn in draws]
        row = _row(case.budget, MARGIN_METHOD, results, schedules[0].solve_s, planned.budget)
        if row.within_budget >= COMPLIANCE and (best is None or row.energy_saved_pct > best.energy_saved_pct):
            best = row
    return best


def noisy_rows(problem: Problem, planner: PolicyPlanner, budgets: Sequence[float], episodes: int, seed: int,
               methods: Sequence[str] = COMPARED, progress: Callable[[str], None] | None = None) -> list[NoisyRow]:
    """The policy's and every method's rows at each budget over ``episodes`` episodes seeded ``seed``,
    ``seed + 1``, ... (the same draws for all of them)."""
    rows = []
    for budget in budgets:
        case = problem.with_budget(budget)
        schedules = plan_methods(case, methods, progress)
        env = policy_env(planner.policy, case, disturbed=True)
        times = env.config.run_steps
        costs = tiled(case.costs, times)
        policy_results, draws, rollout_s = closed_loop(planner.policy, env, budget, episodes, seed, progress)
        rows.append(_row(budget, planner.name, policy_results, rollout_s))
        rows.append(closed_loop_row(Expert(env, "fitting_plan"), env, budget, episodes, seed, RULE_METHOD))
        rows += [_row(budget, s.method, [_open_loop(costs, s, drawn, case.stall_s, times) for drawn in draws],
                      s.solve_s) for s in schedules]
        margin = _margin_row(case, draws, times)
        rows += [margin] if margin is not None else []
    return rows


def closed_loop(actor: Actor, env: KernelDVFSEnv, budget: float, episodes: int, seed: int,
                progress: Callable[[str], None] | None = None) -> tuple[list[Result], list[Disturbances], float]:
    """``actor`` closed-loop through ``env`` at ``budget`` over episodes seeded ``seed``, ``seed + 1``, ...: each
    episode's (energy saved %, slowdown %, switches per step), its draws, and the mean rollout time (s)."""
    results, draws, elapsed_s = [], [], 0.0
    for episode in range(episodes):
        if progress:
            progress(f"episode {episode + 1}/{episodes} @ {budget:.1%}")
        start = time.perf_counter()
        summary = rollout(actor, env, {"step": 0, "budget": budget}, seed + episode)
        elapsed_s += time.perf_counter() - start
        draws.append(env.disturbances)
        results.append((summary["energy_saved_pct"], summary["slowdown_pct"],
                        summary["switches"] / env.config.run_steps))
    return results, draws, elapsed_s / episodes


def closed_loop_row(actor: Actor, env: KernelDVFSEnv, budget: float, episodes: int, seed: int, method: str
                    ) -> NoisyRow:
    """:func:`closed_loop` as one row named ``method``."""
    results, _, solve_s = closed_loop(actor, env, budget, episodes, seed)
    return _row(budget, method, results, solve_s)
