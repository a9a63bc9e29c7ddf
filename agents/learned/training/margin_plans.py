"""The bar a residual policy must clear: the fitting plan with a fixed margin, scored on the same episodes.

A fixed-margin plan is the residual environment's constant action (no residual, margin ``m``: the fitting plan
leaves that share of the step's budget unspent, :mod:`kdvfs.envs.env.observing.measured`); the last, ``release``, runs
the whole step at auto (no saving, never over budget): the bar of a cell no margin keeps. :func:`episodes` runs
any actor closed-loop on every (pair, budget, switching latency, seed) case with every disturbance on (the seed picks
the executed variant and the draws, the same for every method); :func:`best_margins` chooses, per budget x
latency cell, the margin saving the most among those within budget in >= ``COMPLIANCE`` of the episodes (on
validation pairs: the choice is never made on the episodes it is judged on).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kdvfs.agents.common.problem import within_budget
from kdvfs.agents.learned.policy.policy_planner import Actor, rollout
from kdvfs.common.arrays import Array
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.observing.measured import MARGIN_ACTIONS, margin_label
from kdvfs.envs.env.residual_env import ResidualDVFSEnv
from kdvfs.envs.env.steps.shape_pairs import ShapePair
from kdvfs.envs.gpu.profiles import GpuProfile

COMPLIANCE = 0.95
"""The share of episodes within budget a method must reach (the promise)."""
CELL_BUDGETS = (0.005, 0.01, 0.02)
CELL_LATENCY_SCALES = (0.0, 1.0, 2.0)
"""The budget x switching-latency cells every method is scored in."""
MIN_SCORE_SEEDS = 2
"""Noise seeds per validation case at least (:func:`score_seeds`), also for steps without executed variants."""


@dataclass(frozen=True)
class FixedMargin:
    """The margin action ``index`` held throughout (``MARGINS[index]`` of the budget held back, or ``RELEASE``),
    as an actor."""

    index: int

    def act(self, _observation: Array) -> Array:
        return np.array([0, 0, self.index], dtype=np.int64)


def case_config(config: EnvConfig) -> EnvConfig:
    """``config`` as the cases run it: every disturbance on, runs of one step, the cells' budgets and latencies."""
    return config.with_disturbances().replace(run_steps=1, budgets=CELL_BUDGETS, latency_scales=CELL_LATENCY_SCALES)


def episodes(actors: dict[str, Actor], pairs: Sequence[ShapePair], profile: GpuProfile, config: EnvConfig,
             seeds: int, progress: Callable[[int], None] | None = None) -> Array:
    """(methods, pairs, budgets, latencies, seeds, 3) energy saved (%), slowdown (%) and auto's drift at the
    episode's start (%, the case's draw: the same for every method) of each actor of ``actors`` on every case
    (module docstring), in ``actors``' order."""
    config = case_config(config)
    out = np.zeros((len(actors), len(pairs), len(CELL_BUDGETS), len(CELL_LATENCY_SCALES), seeds, 3))
    for p, pair in enumerate(pairs):
        env = ResidualDVFSEnv([pair.predicted], profile, config)
        for b, budget in enumerate(CELL_BUDGETS):
            for s, scale in enumerate(CELL_LATENCY_SCALES):
                for seed in range(seeds):
                    options: dict[str, object] = {"step": 0, "budget": budget, "latency_scale": scale}
                    if pair.executed:  # else the step executes as predicted
                        options["executed"] = pair.executed[seed % len(pair.executed)]
                    for m, actor in enumerate(actors.values()):
                        summary = rollout(actor, env, options, seed)
                        out[m, p, b, s, seed] = (summary["energy_saved_pct"], summary["slowdown_pct"],
                                                 env.disturbances.auto_drift_pct(0))
        if progress is not None:
            progress(1)
    return out


def score_seeds(pairs: Sequence[ShapePair]) -> int:
    """Seeds per validation case: one per executed variant of the pairs (a seed picks variant ``seed % V``), at
    least ``MIN_SCORE_SEEDS``; every variant is scored, not only the first two."""
    return max(MIN_SCORE_SEEDS, max((len(pair.executed) for pair in pairs), default=0))


def within(results: Array, cell_budgets: Sequence[float] = CELL_BUDGETS) -> Array:
    """(..., budgets, latencies, seeds) 0/1 whether each episode of ``results`` (..., budgets, latencies, seeds,
    3 (:func:`episodes`); the budgets ``cell_budgets``) is within its budget."""
    budgets = np.array(cell_budgets)[:, None, None]
    slowdown = results[..., 1]
    return np.vectorize(within_budget)(slowdown, np.broadcast_to(budgets, slowdown.shape[-3:])).astype(float)


def margin_actors() -> dict[str, Actor]:
    """Every fixed-margin plan, by name (``margin-15%``, ``margin-release``), in the margin action's order."""
    return {f"margin-{margin_label(i)}": FixedMargin(i) for i in range(MARGIN_ACTIONS)}


def best_margins(results: Array) -> Array:
    """(budgets, latencies) int: per cell, the margin action (``results`` (margin actions, pairs,
    budgets, latencies, seeds, 3), one row per margin) saving the most on average among those within budget
    in >= ``COMPLIANCE`` of the cell's episodes; the most compliant margin where none reaches it."""
    return most_saving_compliant(within(results).mean(axis=(1, 4)), results[..., 0].mean(axis=(1, 4)))


def most_saving_compliant(share: Array, saving: Array) -> Array:
    """Along the first axis (margin actions): the one saving the most (``saving``, mean %) among those within
    budget in >= ``COMPLIANCE`` of their episodes (``share``), else the most compliant; int, over the other axes."""
    ok = share >= COMPLIANCE
    ranked = np.where(ok, saving, -np.inf)
    return np.where(ok.any(axis=0), ranked.argmax(axis=0), share.argmax(axis=0))


def chosen(results: Array, margins: Array) -> Array:
    """(pairs, budgets, latencies, seeds, 3): each cell's results at its margin ``margins`` (budgets, latencies)
    from ``results`` (margins, pairs, budgets, latencies, seeds, 3)."""
    out = np.empty(results.shape[1:])
    for b in range(margins.shape[0]):
        for s in range(margins.shape[1]):
            out[:, b, s] = results[margins[b, s], :, b, s]
    return out
