"""What a controller measures of a running step, honestly, and the one observation a residual policy decides on.

A controller inside real training knows the step it predicted (the step model's kernels and their cost at
every clock pair), the host time since the step started, the clocks in effect and pending, the auto mode's
drift as the A windows of its A/B measurement measure it, and where the GPU is as its anchors place it. From
that alone (:class:`MeasuredState`) :func:`residual_observation` computes the policy's observation; the
environment (:class:`~kdvfs.envs.env.residual_env.ResidualDVFSEnv`) builds the same state from its simulation
through :class:`Measurement`, the way the runtime does:

* **drift**: measured once per run with the error of the A windows (``drift_sd_pct``); applied only where clocks
  drift: auto's kernels, and a locked core clock above what the power limiter now holds (:func:`drift_factors`),
  never to a locked clock below it;
* **position**: the kernel the last anchor passed stands for, extrapolated at the prediction's pace at the
  clocks running, stretched by the measured auto scale (never back before the last estimate);
* **prediction error**: the host time so far over the prediction's time for the kernels passed at the clocks
  they ran at with the measured drift applied (:class:`~kdvfs.envs.env.live.PredictedElapsed`);
* **budget**: used = host time - the prediction's auto time for the kernels passed x (1 + drift) x (1 + error):
  the auto time a controller can know.

The action (:func:`residual_pair`) is a residual over the fitting plan's pair for the coming segment (core
clock up or down by a few of the grid's levels, memory clock up or down) and a margin (the share of the slack
still affordable that the fitting plan must leave unspent); the zero action is the fitting plan itself.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from kdvfs.envs.env.dynamic_observation import (
    L_BUDGET_PLAN,
    L_FITTING,
    L_FITTING_SLOT,
    L_LEVELS,
    L_MEMORIES,
    L_PLAN_SLOT,
    L_PLANS,
    L_PLANS_REST,
    observe_dynamic,
)
from kdvfs.envs.env.live import PredictedElapsed
from kdvfs.envs.env.live_tables import LiveTables
from kdvfs.envs.env.observation import OBS_LIMIT, PLAN_ADVISOR_FEATURES, REMAINING_LATENCIES_CAP, ObservationSpec
from kdvfs.envs.model.cost_model import Array

RESIDUAL_OBSERVATION_VERSION = 6
CORE_STEPS = (0, -1, 1, -2, 2, -4, 4)
"""Core residuals, in grid levels (positive: a lower core clock); index 0 is none."""
MEMORY_STEPS = (0, 1, -1)
"""Memory residuals, in the grid's memory clocks (positive: a lower memory clock); index 0 is none."""
MARGINS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4)
"""Shares of the remaining slack held back; index 0 is none."""
TIME_TOLERANCE_S = 1e-12
"""A kernel starting this close after the extrapolated instant counts as starting then (s)."""
ERROR_HISTORY = 3
"""Prediction errors measured at the last decisions shown."""
FEATURES = (
    "budget_pct", "budget_used", "affordable_pct", "progress", "remaining_latencies",
    "latency_ms", "drift_pct", "prediction_error_pct", *(f"error_{i + 1}_ago_pct" for i in range(ERROR_HISTORY)),
    "last_latency_ratio", "margin_held",
    "fitting_exists", "fitting_rest_saving_pct", "fitting_rest_slowdown_pct", "fitting_core", "fitting_auto",
    "fitting_memory", "segment_latencies", "budget_plan_rest_slowdown_pct",
    "core_in_effect", "auto_in_effect", "memory_in_effect", "pending",
)
"""The observation's fixed entries, in order; each plan's rest-of-step saving then slowdown follow (2 x P)."""


class MeasuredState(NamedTuple):
    """One decision point as a controller measures it (module docstring).

    Attributes:
        kernel: the kernel the GPU is at, as the anchors place it.
        in_effect, pending: grid pair in effect; pair requested and not yet in effect (-1: none).
        pending_age_s: host time since that request (s; 0 if none).
        elapsed_s: host time since the step started (s).
        model_elapsed_s: the prediction's time for the kernels before ``kernel`` at the clocks they ran at, the
            measured drift applied where it slows them, stalls included (s; 0: none run yet).
        drift_pct: auto's measured drift (%).
        last_latency_ratio: the last change's measured latency over the mean (1 if none).
    """

    kernel: int
    in_effect: int
    pending: int
    pending_age_s: float
    elapsed_s: float
    model_elapsed_s: float
    drift_pct: float
    last_latency_ratio: float = 1.0


@dataclass(frozen=True)
class ResidualSpec:
    """The residual policy's observation layout: :data:`FEATURES`, then each plan's rest-of-step saving and
    slowdown (``plans`` of each). Its hash goes into every frozen policy."""

    plans: int
    grid: dict[str, object]

    @property
    def size(self) -> int:
        return len(FEATURES) + 2 * self.plans

    def describe(self) -> dict[str, object]:
        return {"version": RESIDUAL_OBSERVATION_VERSION, "features": list(FEATURES), "plans": self.plans,
                "core_steps": list(CORE_STEPS), "memory_steps": list(MEMORY_STEPS), "margins": list(MARGINS),
                "grid": self.grid}

    def hash(self) -> str:
        """sha256 (hex, first 16 characters) of :meth:`describe`."""
        return hashlib.sha256(json.dumps(self.describe(), sort_keys=True).encode("utf-8")).hexdigest()[:16]


def drift_factors(core_fraction: Array, memories: int, drift_pct: float) -> Array:
    """(G,) factor on each grid pair's time under auto drift ``drift_pct``: 1 + drift at the auto levels (the
    first ``memories`` pairs), and at a locked core clock of ``core_fraction`` of the maximum only what lies
    above the limiter's clock (max(1, fraction x (1 + drift))), as :mod:`kdvfs.envs.env.dynamics` simulates."""
    scale = 1.0 + drift_pct / 100.0
    factors = np.maximum(1.0, core_fraction * scale)
    factors[:memories] = scale
    return factors


def residual_pair(pair: int, core_step: int, memory_step: int, levels: int, memories: int) -> int:
    """Grid pair ``pair`` moved ``core_step`` core levels (positive: lower clock; an auto core level stays
    auto, a locked one stays locked) and ``memory_step`` memory clocks (positive: lower), clipped to the grid."""
    level, memory = divmod(pair, memories)
    if level > 0:
        level = min(max(level + core_step, 1), levels - 1)
    memory = min(max(memory + memory_step, 0), memories - 1)
    return level * memories + memory


class Measurement:
    """A controller's measurements of one run's step, accumulated decision by decision: the position from the
    anchors and the prediction's elapsed time (module docstring).

    Args:
        cumulative_s: (K + 1, G) the prediction's start of each kernel at each pair (s).
        stall_s: GPU stall per clock change (s).
        anchors: sorted kernels that carry an anchor (kernel 0 first: the step's start).
        factors: (G,) :func:`drift_factors` of the measured drift.
    """

    def __init__(self, cumulative_s: Array, stall_s: float, anchors: Array, factors: Array) -> None:
        self.cumulative_s, self.anchors, self.factors = cumulative_s, anchors, factors
        self._elapsed = PredictedElapsed(cumulative_s, stall_s, factors)
        self._kernel = 0
        self.errors = np.zeros(ERROR_HISTORY)

    def kernel(self, passed: int, passed_at_s: float, now_s: float, in_effect: int) -> int:
        """The kernel the GPU starts next at host ``now_s`` (the environment's decision point is before kernel
        ``passed``), from the last anchor before it (started at host ``passed_at_s``), at the prediction's pace
        at ``in_effect``'s clocks stretched by the measured drift; never before the last estimate."""
        kernels = len(self.cumulative_s) - 1
        times = self.cumulative_s[:, in_effect]
        anchor = int(self.anchors[max(int(np.searchsorted(self.anchors, passed, side="left")) - 1, 0)])
        model_s = (now_s - passed_at_s) / self.factors[in_effect]
        starting = int(np.searchsorted(times, times[anchor] + model_s - TIME_TOLERANCE_S, side="left"))
        self._kernel = max(self._kernel, min(max(starting, anchor), kernels - 1))
        return self._kernel

    def model_elapsed(self, kernel: int, in_effect: int) -> float:
        """The prediction's time before ``kernel`` at the clocks run, drift applied (s)."""
        return self._elapsed.at(kernel, in_effect)

    def record_error(self, error_pct: float) -> None:
        """Keep the prediction error measured at a decision (the newest first)."""
        self.errors = np.roll(self.errors, 1)
        self.errors[0] = error_pct


def budget_use(state: MeasuredState, predicted_auto_s: float) -> tuple[float, float]:
    """(budget used (s, host), prediction error (a factor - 1)) at ``state``: host time minus the prediction's
    auto time for the kernels passed (``predicted_auto_s``) x (1 + drift) x (1 + error)."""
    error = state.elapsed_s / state.model_elapsed_s - 1.0 if state.model_elapsed_s > 0 else 0.0
    return state.elapsed_s - predicted_auto_s * (1.0 + state.drift_pct / 100.0) * (1.0 + error), error


def residual_observation(out: Array, tables: LiveTables, state: MeasuredState, budget: float, budget_plan: int,
                         margin: float, errors: Array) -> int:
    """Write the residual policy's observation at ``state`` into ``out`` ((spec size,) float32) and return the
    fitting plan's pair (the expert's, with ``margin`` of the slack held back; auto if no plan fits).

    Every entry is computed from the measured state, the prediction (``tables``) and ``errors`` (the prediction
    errors of the last decisions, %): what a controller knows. The fitting plan is the advisors' own
    (:func:`~kdvfs.envs.env.dynamic_observation.observe_dynamic`), fed on the prediction's timeline (host
    seconds over the measured auto scale, the drift applied where it slows the clocks run)."""
    sizes = tables.sizes
    lay = tables.layout
    kernels, plans = int(sizes[0]), int(lay[L_PLANS])
    levels, memories = int(lay[L_LEVELS]), int(lay[L_MEMORIES])
    k = min(max(state.kernel, 0), kernels - 1)
    scale = 1.0 + state.drift_pct / 100.0
    auto_s, step_s = float(tables.cumulative_s[k, 0]), tables.auto_time_s
    used_s, error = budget_use(state, auto_s)
    used_model_s = used_s / (scale * (1.0 + error))
    slack_s = max(budget * step_s - used_model_s, 0.0)
    held_budget = budget - margin * slack_s / step_s
    obs, advice = tables.obs, tables.advice
    in_effect = state.in_effect
    observe_dynamic(obs, advice, tables.static_rows[k], lay, tables.advisor_index, tables.cumulative_s,
                    tables.landings[in_effect, 0], tables.landings[in_effect, 1], tables.plan_pairs, tables.plan_rest,
                    tables.joinable, tables.next_change, tables.speeds_up, k, in_effect, state.pending,
                    tables.latency_s - state.pending_age_s / scale, state.elapsed_s / scale, auto_s,
                    state.model_elapsed_s / scale, state.last_latency_ratio, state.drift_pct, held_budget, step_s,
                    tables.latency_s, tables.stall_s, budget_plan)
    fitting_start, budget_start = int(lay[L_FITTING]), int(lay[L_BUDGET_PLAN])
    fitting_pair = int(advice[int(lay[L_FITTING_SLOT])])
    remaining_s = step_s - auto_s
    affordable = 100.0 * (budget * step_s - used_model_s) / max(remaining_s, 1e-6 * step_s)
    effect = int(tables.landings[in_effect, 0, k])
    fitting_plan = _fitting_plan(advice, lay, fitting_pair, obs[fitting_start + PLAN_ADVISOR_FEATURES.index("exists")])
    segment_end = int(tables.next_change[effect, fitting_plan]) if fitting_plan >= 0 else kernels
    segment_s = float(tables.cumulative_s[segment_end, fitting_pair] - tables.cumulative_s[effect, fitting_pair])
    latency_s = tables.latency_s
    level, memory = divmod(fitting_pair, memories)
    level_now, memory_now = divmod(in_effect, memories)
    values = [
        100.0 * budget, used_model_s / (max(budget, 1e-3) * step_s), affordable, auto_s / step_s,
        min(remaining_s / latency_s if latency_s > 0 else REMAINING_LATENCIES_CAP, REMAINING_LATENCIES_CAP)
        / REMAINING_LATENCIES_CAP,
        1e3 * latency_s, state.drift_pct, 100.0 * error, *errors, state.last_latency_ratio, margin,
        obs[fitting_start + 3], obs[fitting_start], obs[fitting_start + 1], level / max(levels - 1, 1),
        float(level == 0), memory / max(memories - 1, 1),
        min(segment_s / latency_s if latency_s > 0 else REMAINING_LATENCIES_CAP, REMAINING_LATENCIES_CAP)
        / REMAINING_LATENCIES_CAP,
        obs[budget_start + 1], level_now / max(levels - 1, 1), float(level_now == 0), memory_now / max(memories - 1, 1),
        float(state.pending >= 0),
    ]
    out[:len(FEATURES)] = np.clip(values, -OBS_LIMIT, OBS_LIMIT)
    rest = int(lay[L_PLANS_REST])
    out[len(FEATURES):] = obs[rest:rest + 2 * plans]
    return fitting_pair


def _fitting_plan(advice: Array, lay: Array, pair: int, exists: float) -> int:
    """Which plan the fitting advisor follows (-1: none fits), as far as its pair tells: the first plan proposing
    it."""
    if not exists:
        return -1
    start, plans = int(lay[L_PLAN_SLOT]), int(lay[L_PLANS])
    found = np.flatnonzero(advice[start:start + plans] == pair)
    return int(found[0]) if len(found) else -1


def policy_spec(spec: ObservationSpec) -> ResidualSpec:
    """The residual observation's spec beside the advisors' ``spec`` (same grid and plans)."""
    return ResidualSpec(len(spec.plan_budgets), spec.grid.describe())
