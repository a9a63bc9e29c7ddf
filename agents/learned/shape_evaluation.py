"""A policy and the plans of predicted steps on executed steps of other shapes (``kdvfs evaluate --reference``).

A run captured at a few shapes (the references) executes steps of a shape the controller knows when they start
(``meta.step_shape``) but of kernels it does not. Per executed step, each method's energy saving and slowdown
against auto on that step (%): ``auto``; ``reference-plan``, the latency-aware plans of the step model's
prediction for the shape (:mod:`kdvfs.envs.model.step_model`) followed with live budget feedback (the
``fitting_plan`` rule); ``policy``, the frozen policy deciding on the prediction's observations;
``prediction-optimum``, the latency-aware optimum of the predicted step, each executed kernel run at the action of
the predicted kernel that stands for it (:func:`~kdvfs.envs.model.step.align.slots`), open loop: the best fixed
plan a controller that trusts the prediction can make, the prediction's own limit; ``oracle``, the latency-aware
optimum re-solved on the executed step. The controller side sees only what the runtime would
(references, shape, progress, budget use) while the environment executes the real step under it
(``reset(options={"executed": ...})``); only ``oracle`` reads the executed step. The controller side plans and
decides at the budget times the references' prediction margin (:mod:`kdvfs.agents.planners.prediction_margin`),
as the runtime does; every method is scored at the budget. A shape the step model does not cover runs at auto.
With ``episodes``, each method runs that many seeded episodes with the environment's disturbances;
``within_budget`` is the share of them within budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kdvfs.agents.common.problem import Problem, within_budget
from kdvfs.agents.learned.policy.frozen import FrozenPolicy
from kdvfs.agents.learned.policy.policy_planner import Actor, policy_env, rollout
from kdvfs.agents.learned.training.imitation import Expert
from kdvfs.agents.planners.latency_optimal import LatencyOptimal
from kdvfs.agents.planners.prediction_margin import PredictionMargin, prediction_margin
from kdvfs.common.arrays import Array
from kdvfs.common.errors import KdvfsError
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.dynamics import Disturbances, draw, execute_open_loop
from kdvfs.envs.env.steps.step_data import StepData
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.schedule import replay
from kdvfs.envs.model.step.align import slots
from kdvfs.envs.model.step_model import AlignedSteps, StepModel
from kdvfs.envs.trace.trace import Trace

METHODS = ("auto", "reference-plan", "policy", "prediction-optimum", "oracle")
Episode = tuple[float, float]
"""One episode of one method: energy saved (%), slowdown (%)."""


@dataclass(frozen=True)
class Controller:
    """What the controller side has for one executed step: its shape's predicted step, priced, and the
    policy's environment on it (None where the step model does not cover the shape: the step runs at auto)."""

    predicted: Problem | None
    env: KernelDVFSEnv | None


def controller_for(model: StepModel, executed: Trace, policy: FrozenPolicy, profile: GpuProfile, budget: float,
                   latency_s: float | None, disturbed: bool) -> Controller:
    """The controller side of ``executed``: reads its ``meta.step_shape`` and nothing else of it."""
    shape = executed.meta.step_shape
    if shape is None:
        raise KdvfsError(f"executed trace {executed.meta.workload!r} has no meta.step_shape: the controller "
                         "needs the step's shape")
    if not model.covers(shape):
        return Controller(None, None)
    predicted = Problem.build(model.predict(shape), profile, budget, latency_s)
    return Controller(predicted, policy_env(policy, predicted, disturbed, one_step=True))


def _summary(env: KernelDVFSEnv) -> Episode:
    summary = env.episode_summary()
    return float(summary["energy_saved_pct"]), float(summary["slowdown_pct"])


def _closed_loop(actor: Actor, env: KernelDVFSEnv, budget: float, view: StepData, seeds: Sequence[int]
                 ) -> list[Episode]:
    results = []
    for seed in seeds:
        rollout(actor, env, {"step": 0, "budget": budget, "executed": view}, seed)
        results.append(_summary(env))
    return results


def _open_loop(executed: Problem, actions: Array, env: KernelDVFSEnv | None, seeds: Sequence[int],
               disturbed: bool) -> list[Episode]:
    """``actions`` (one per executed kernel) executed open loop on the executed step, through each seed's
    disturbances (none unless ``disturbed``)."""
    costs, results = executed.costs, []
    for seed in seeds:
        if disturbed and env is not None:
            drawn = draw(np.random.default_rng(seed), env.timing.disturbances, costs.kernels, 1,
                         executed.auto.time_s)
        else:
            drawn = None
        if drawn is None:
            still = Disturbances(None, None, None, None, executed.latency_s)
            outcome = execute_open_loop(costs, actions, still, executed.stall_s)
            auto = executed.auto
        else:
            outcome = execute_open_loop(costs, actions, drawn, executed.stall_s)
            auto = replay(drawn.apply(costs), np.full(costs.kernels, costs.auto_index), executed.stall_s)
        results.append((100.0 * (1.0 - outcome.energy_j / auto.energy_j), 100.0 * (outcome.time_s / auto.time_s - 1)))
    return results


def _method(results: list[Episode], budget: float) -> dict[str, float]:
    saved, slowdown = np.array(results).T
    return {"energy_saved_pct": float(saved.mean()), "slowdown_pct": float(slowdown.mean()),
            "within_budget": float(np.mean([within_budget(float(s), budget) for s in slowdown]))}


def evaluate_step(model: StepModel, executed: Trace, policy: FrozenPolicy, profile: GpuProfile, budget: float,
                  latency_s: float | None, episodes: int | None, seed: int, margin: float = 1.0
                  ) -> dict[str, dict[str, float]]:
    """Every method of the module docstring on one executed step: its mean saving and slowdown (%) and its
    share of episodes within ``budget``; the controller side at ``budget * margin``."""
    disturbed = episodes is not None
    seeds = [seed + e for e in range(episodes or 1)]
    planned_budget = budget * margin
    controller = controller_for(model, executed, policy, profile, planned_budget, latency_s, disturbed)
    executed_problem = Problem.build(executed, profile, budget, latency_s)
    auto = [(0.0, 0.0)] * len(seeds)
    methods = {"auto": _method(auto, budget)}
    if controller.env is None or controller.predicted is None:
        methods["reference-plan"] = methods["policy"] = _method(auto, budget)
    else:
        env = controller.env
        view = StepData.executed_as(controller.predicted.trace, executed_problem.trace, executed_problem.costs,
                                    env.grid)
        methods["reference-plan"] = _method(_closed_loop(Expert(env, "fitting_plan"), env, planned_budget, view,
                                                         seeds), budget)
        methods["policy"] = _method(_closed_loop(policy, env, planned_budget, view, seeds), budget)
    if controller.predicted is None:
        methods["prediction-optimum"] = _method(auto, budget)
    else:
        planned = LatencyOptimal().plan(controller.predicted).actions
        methods["prediction-optimum"] = _method(_open_loop(
            executed_problem, planned[slots(controller.predicted.trace, executed)], controller.env, seeds, disturbed),
            budget)
    methods["oracle"] = _method(_open_loop(executed_problem, LatencyOptimal().plan(executed_problem).actions,
                                           controller.env, seeds, disturbed), budget)
    return methods


def evaluate_shapes(policy: FrozenPolicy, references: Sequence[Trace], executed: Sequence[tuple[str, Trace]],
                    profile: GpuProfile, budget: float, latency_s: float | None = None, episodes: int | None = None,
                    seed: int = 0, margin: PredictionMargin | None = None) -> dict[str, object]:
    """``kdvfs evaluate --reference``'s JSON: ``{"steps": [{"trace", "covered", "methods": {METHOD:
    {energy_saved_pct, slowdown_pct, within_budget}}}], "summary": {METHOD: {energy_saved_pct, slowdown_pct,
    within_budget}}, "prediction_margin": {margin, slowdowns_pct}}``, the summary's figures means over the steps;
    ``covered``: whether the step model covers the step's shape (else every method but ``oracle`` runs at auto).
    ``executed``: (label, trace) pairs; ``margin``: the references' prediction margin at ``budget`` and
    ``latency_s`` where the caller has it (None: computed here)."""
    aligned = AlignedSteps.of(references)
    model = StepModel.of_aligned(aligned)
    margin = margin or prediction_margin(aligned, profile, budget, latency_s)
    steps = [{"trace": label, "covered": model.covers(trace.meta.step_shape) if trace.meta.step_shape else False,
              "methods": evaluate_step(model, trace, policy, profile, budget, latency_s, episodes, seed,
                                       margin.margin)}
             for label, trace in executed]
    summary = {}
    for method in METHODS:
        rows = [step["methods"][method] for step in steps]  # type: ignore[index]
        summary[method] = {"energy_saved_pct": float(np.mean([r["energy_saved_pct"] for r in rows])),
                           "slowdown_pct": float(np.mean([r["slowdown_pct"] for r in rows])),
                           "within_budget": float(np.mean([r["within_budget"] for r in rows]))}
    return {"steps": steps, "summary": summary, "prediction_margin": margin.as_json()}
