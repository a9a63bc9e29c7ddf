"""What a controller measures of a running step, honestly, and the one observation a residual policy decides on.

A controller knows the step it predicted (its kernels' cost at every clock pair), the host time since the step
started, the clocks in effect and pending, the auto drift as its A windows measure it, and where the GPU is as its
anchors place it (:class:`MeasuredState`); from that alone :func:`residual_observation` computes the residual
policy's observation, and the environment (:class:`~kdvfs.envs.env.residual_env.ResidualDVFSEnv`) builds the same
state from its simulation through :class:`Measurement`. Invariants: the measured drift (auto's step time over the
prediction's) applies at every clock (:func:`drift_factors`); the position never goes back before the last estimate;
budget used (host s) = host time - the prediction's auto time up to the position x (1 + drift) x (1 + error)
(:func:`budget_use`). The action (:func:`residual_pair`) is a core/memory residual over the fitting plan's pair and
a margin on the budget, or the release of the clocks to auto for the rest of the step (:data:`RELEASE`); the zero
action is the fitting plan. Design and measurements: ``docs/learning.md`` (the residual design).
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.envs.env.observing.live_tables import LiveTables
from kdvfs.envs.env.observing.observation import ObservationSpec
from kdvfs.envs.env.observing.residual_kernel import budget_use_of, observe_residual
from kdvfs.envs.env.observing.residual_kernel import residual_pair as residual_pair

RESIDUAL_OBSERVATION_VERSION = 10
CORE_STEPS = (0, -1, 1, -2, 2, -4, 4)
"""Core residuals, in grid levels (positive: a lower core clock); index 0 is none."""
MEMORY_STEPS = (0, 1, -1)
"""Memory residuals, in the grid's memory clocks (positive: a lower memory clock); index 0 is none."""
MARGINS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
"""Shares of the step's budget held back: the fitting plan fits the budget x (1 - margin), whatever was spent
and however often it decides (a share of the remaining slack, as before v10, is given back at every decision: at
ideal switching every margin under 100% spent nearly the whole budget); index 0 is none."""
RELEASE = len(MARGINS)
"""The margin action's last index, after ``MARGINS``: release the clocks to auto (core and memory) and request
nothing more this step, the residuals ignored; what a controller does by resetting the clocks once and going
quiet. The one action that spends no more of the budget (beyond the change's own stall)."""
MARGIN_ACTIONS = len(MARGINS) + 1
"""Choices of the margin action: each of ``MARGINS``, then ``RELEASE``."""
TIME_TOLERANCE_S = 1e-12
"""A kernel starting this close after the extrapolated instant counts as starting then (s)."""
POSITION_TOLERANCE = 0.03
"""The uncertainty of a position extrapolated from an anchor, as a share of the prediction's auto time since it
(a kernel whose start lies within it counts as not started: a change requested then is for that kernel)."""
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
        kernel: the kernel the GPU starts next, as the anchors place it (:meth:`Measurement.kernel`).
        in_effect, pending: grid pair in effect; pair requested and not yet in effect (-1: none).
        pending_age_s: host time since that request (s; 0 if none).
        elapsed_s: host time since the step started (s).
        model_elapsed_s: the prediction's time up to the position at the clocks run, the measured drift applied,
            stalls included (s; 0: none run yet).
        auto_elapsed_s: the prediction's auto time up to the position (s, no drift).
        drift_pct: auto's measured drift: its step time over the prediction's, minus 1 (%).
        last_latency_ratio: the last change's measured latency over the mean (1 if none).
    """

    kernel: int
    in_effect: int
    pending: int
    pending_age_s: float
    elapsed_s: float
    model_elapsed_s: float
    auto_elapsed_s: float
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
                "release": RELEASE, "grid": self.grid}

    def hash(self) -> str:
        """sha256 (hex, first 16 characters) of :meth:`describe`."""
        return hashlib.sha256(json.dumps(self.describe(), sort_keys=True).encode("utf-8")).hexdigest()[:16]


def drift_factors(pairs: int, drift_pct: float) -> Array:
    """(``pairs``,) factor on each grid pair's predicted time at the measured drift ``drift_pct``: 1 + drift at
    every pair. The drift a controller measures is auto's step time over the prediction's: the step's own error
    (at every clock) and the power limiter's drift together, which it cannot tell apart; that a locked clock
    below the limiter's escapes the latter (:mod:`kdvfs.envs.env.dynamics` simulates it) is not assumed."""
    return np.full(pairs, 1.0 + drift_pct / 100.0)


def margin_label(index: int) -> str:
    """The margin action ``index`` in words: ``15%`` (of the budget held back) or ``release`` (:data:`RELEASE`)."""
    return "release" if index == RELEASE else f"{100 * MARGINS[index]:g}%"


class Measurement:
    """A controller's measurements of one run's step, accumulated decision by decision (module docstring).

    Positions are fractional kernels (kernel ``k`` plus the share of it run): a controller between anchors
    knows the GPU is some way into a kernel, not that it stands on a kernel's start. The position runs from the
    last anchor through the clocks seen in effect since (:meth:`landed`), each stretch at the prediction's pace
    at its clocks stretched by the measured drift, a stall after each change; it never goes back. The
    prediction's time at the clocks run counts each stretch between two landings at its clocks, fractions
    included, so that a landing placed a hair past a kernel's start counts a hair of it at the old clocks, not
    the whole kernel.

    Args:
        cumulative_s: (K + 1, G) the prediction's start of each kernel at each pair (s).
        stall_s: GPU stall per clock change (s).
        anchors: sorted kernels that carry an anchor (kernel 0 first: the step's start).
        factors: (G,) :func:`drift_factors` of the measured drift.
        paces: (anchors,) the step's measured pace from each anchor to the next (its auto time over the
            prediction's, as the A windows' steps of the shape measure it); None: 1 (the prediction's pace).
    """

    def __init__(self, cumulative_s: Array, stall_s: float, anchors: Array, factors: Array,
                 paces: Array | None = None) -> None:
        self.cumulative_s, self.stall_s, self.anchors, self.factors = cumulative_s, stall_s, anchors, factors
        self.paces = np.ones(len(anchors)) if paces is None else paces
        self._position = 0.0
        self._anchor = 0
        self._landed_s: list[float] = []
        self._landed_at: list[float] = []
        self._pairs: list[int] = []
        self._model_s: list[float] = []
        self.errors = np.zeros(ERROR_HISTORY)

    def landed(self, at_s: float, pair: int, position: float) -> None:
        """A change to ``pair`` seen landing at host ``at_s`` at ``position`` (:meth:`position` then; the step's
        first pair: at 0, 0); in time order."""
        model_s = self.model_elapsed(position) + (self.stall_s if self._pairs else 0.0)
        self._landed_s.append(at_s)
        self._landed_at.append(position)
        self._pairs.append(pair)
        self._model_s.append(model_s)

    def position(self, passed: int, passed_at_s: float, now_s: float) -> float:
        """The GPU's (fractional) kernel position at host ``now_s``, from the last anchor before kernel
        ``passed`` (started at host ``passed_at_s``) through the clocks seen in effect since, at the step's
        measured pace after that anchor; short of the next anchor (not seen yet); never before the last
        estimate."""
        index = max(int(np.searchsorted(self.anchors, passed, side="left")) - 1, 0)
        anchor, pace = int(self.anchors[index]), float(self.paces[index])
        limit = float(self.anchors[index + 1]) if index + 1 < len(self.anchors) else len(self.cumulative_s) - 1.0
        at = max(bisect.bisect_right(self._landed_s, passed_at_s), 1)
        pair, position, from_s = self._pairs[at - 1], float(anchor), passed_at_s
        for landed_s, landed in zip(self._landed_s[at:], self._pairs[at:], strict=True):
            if landed_s >= now_s:
                break
            position = self._after(position, pair, (landed_s - from_s) / pace)
            pair, from_s = landed, landed_s + self.stall_s
        position = min(self._after(position, pair, (now_s - from_s) / pace), limit)
        self._position = max(self._position, position)
        self._anchor = anchor
        return self._position

    def kernel(self, position: float) -> int:
        """The kernel the GPU starts next at ``position`` (of the last :meth:`position`): a kernel whose start
        lies within the position's uncertainty before it (``POSITION_TOLERANCE`` of the prediction's auto time
        since the anchor, plus ``TIME_TOLERANCE_S``) counts as not started yet."""
        kernels = len(self.cumulative_s) - 1
        whole = int(position)
        times = self.cumulative_s[:, 0]
        since_s = _time_at(times, position) - float(times[self._anchor])
        if whole < kernels and _time_at(times, position) - float(times[whole]) \
                <= TIME_TOLERANCE_S + POSITION_TOLERANCE * since_s:
            return whole
        return min(whole + 1, kernels - 1)

    def model_elapsed(self, position: float) -> float:
        """The prediction's time up to ``position`` at the clocks run, drift applied, stalls included (s)."""
        if not self._pairs:
            return 0.0
        at = max(bisect.bisect_right(self._landed_at, position) - 1, 0)
        pair, times = self._pairs[at], self.cumulative_s[:, self._pairs[at]]
        run_s = _time_at(times, max(position, self._landed_at[at])) - _time_at(times, self._landed_at[at])
        return self._model_s[at] + run_s * float(self.factors[pair])

    def auto_elapsed(self, position: float) -> float:
        """The prediction's auto time up to ``position`` (s, no drift)."""
        return _time_at(self.cumulative_s[:, 0], position)

    def _after(self, position: float, pair: int, host_s: float) -> float:
        """The position ``host_s`` after ``position`` at ``pair``'s clocks."""
        times = self.cumulative_s[:, pair]
        return _position_at(times, _time_at(times, position) + max(host_s, 0.0) / float(self.factors[pair]))

    def record_error(self, error_pct: float) -> None:
        """Keep the prediction error measured at a decision (the newest first)."""
        self.errors = np.roll(self.errors, 1)
        self.errors[0] = error_pct


def _time_at(times: Array, position: float) -> float:
    """The prediction's time at fractional kernel ``position`` on ``times`` ((K + 1,) starts, s)."""
    k = min(int(position), len(times) - 2)
    return float(times[k] + (position - k) * (times[k + 1] - times[k]))


def _position_at(times: Array, time_s: float) -> float:
    """The fractional kernel position at the prediction's time ``time_s`` on ``times`` (clipped to the step)."""
    kernels = len(times) - 1
    k = min(max(int(np.searchsorted(times, time_s, side="right")) - 1, 0), kernels - 1)
    length = float(times[k + 1] - times[k])
    return float(min(k + (min(max((time_s - times[k]) / length, 0.0), 1.0) if length > 0 else 1.0), kernels))


def budget_use(state: MeasuredState) -> tuple[float, float]:
    """(budget used (s, host), prediction error (a factor - 1)) at ``state``: host time minus the prediction's
    auto time up to the position (``auto_elapsed_s``) x (1 + drift) x (1 + error); the error reads 0 until both
    host and predicted time have begun (a controller's first reading of a step can place the GPU past kernel 0 at
    host time 0)."""
    return budget_use_of(state.elapsed_s, state.model_elapsed_s, state.auto_elapsed_s, state.drift_pct)


def residual_observation(out: Array, tables: LiveTables, state: MeasuredState, budget: float, budget_plan: int,
                         margin: float, errors: Array) -> int:
    """Write the residual policy's observation at ``state`` into ``out`` ((spec size,) float32) and return the
    fitting plan's pair (the expert's, with ``margin`` of the budget held back; auto if no plan fits): the compiled
    :func:`~kdvfs.envs.env.observing.residual_kernel.observe_residual`, which a controller's compiled decisions
    call with the same arguments.

    Every entry is computed from the measured state, the prediction (``tables``) and ``errors`` (the prediction
    errors of the last decisions, %): what a controller knows. The fitting plan is the advisors' own
    (:func:`~kdvfs.envs.env.observing.dynamic_observation.observe_dynamic`), fed on the prediction's timeline (host
    seconds over the measured auto scale, the drift applied at the clocks run)."""
    return observe_residual(out, tables.obs, tables.advice, tables.static_rows, tables.layout, tables.advisor_index,
                            tables.cumulative_s, tables.landings, tables.plan_pairs, tables.plan_rest,
                            tables.joinable, tables.next_change, tables.speeds_up, tables.sizes, tables.auto_time_s,
                            tables.latency_s, tables.stall_s, budget, budget_plan, margin, errors, state.kernel,
                            state.in_effect, state.pending, state.pending_age_s, state.elapsed_s,
                            state.model_elapsed_s, state.auto_elapsed_s, state.drift_pct, state.last_latency_ratio)


def policy_spec(spec: ObservationSpec) -> ResidualSpec:
    """The residual observation's spec beside the advisors' ``spec`` (same grid and plans)."""
    return ResidualSpec(len(spec.plan_budgets), spec.grid.describe())
