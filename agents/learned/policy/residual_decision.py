"""A residual policy's online decisions, compiled: one call per decision point and per look-ahead.

:class:`~kdvfs.agents.learned.policy.residual_online.ResidualOnlinePolicy` binds its arrays once per step's tables
(:class:`BoundResidual`: the environment's live tables, the policy's forward pass, the decider's buffers) and
calls :func:`begin_bound` at a step's start, :func:`decide_residual` at each decision point,
:func:`first_change_residual` for the states ahead and :func:`warm_residual` for a throwaway rehearsal. Each
observes with :func:`~kdvfs.envs.env.observing.residual_kernel.observe_residual`, the computation behind the
environment's :func:`~kdvfs.envs.env.observing.measured.residual_observation`, runs the policy with
:func:`~kdvfs.agents.learned.policy.forward.act` (the function ``FrozenPolicy.act`` calls, on the same arrays) and
keeps the step's state (the standing order, the prediction errors measured at the policy's decisions, the next
budget event, the release) in the bound arrays. The states' times are
:class:`~kdvfs.envs.env.observing.live.LiveState`'s (host over the measured auto scale); each is turned into the
environment's measured state (host seconds) by :func:`host_times`, so decisions are the environment's bit for
bit. No Python runs between a decision's observation and its pair.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba.core import types
from numba.experimental import structref

from kdvfs.agents.learned.policy.forward import act
from kdvfs.common.compiled import compiled
from kdvfs.envs.env.advice.plan_advice import EPS
from kdvfs.envs.env.observing.residual_kernel import budget_use_of, observe_residual, residual_pair

NEXT_EVENT, RELEASED = range(2)
"""Entries of :attr:`BoundResidual.counters`: the next budget event (its index, from 1), whether the step's clocks
were released (1) or not (0)."""
RESIDUAL_FIELDS = (
    "out", "acted_on", "scratch", "errors", "action", "counters",
    "obs", "advice", "static_rows", "lay", "advisor_index", "cumulative_s", "landings", "plan_pairs", "plan_rest",
    "joinable", "next_change", "speeds_up", "sizes", "auto_time_s", "latency_s", "stall_s",
    "margins", "core_steps", "memory_steps", "levels", "memories", "events", "event_time_s",
    "first", "mean", "inverse_std", "clip", "products", "picks", "later", "bounds", "activation")
"""What :class:`BoundResidual` holds: the decider's buffers (the observation decided on, its copy the policy ran
on, a throwaway observation, the errors (%), the standing order, ``counters``), the live tables (through
``stall_s``), the action's tables (``MARGINS``, ``CORE_STEPS``, ``MEMORY_STEPS``; the grid's levels and memory
clocks), the budget events per step and the step's auto time they divide (s), and the policy's forward pass
(``FrozenPolicy.forward_inputs(0)`` with one zero row of products)."""


@structref.register
class BoundResidualType(types.StructRef):
    """numba's type of :class:`BoundResidual`."""

    def preprocess_fields(self, fields: tuple[tuple[str, types.Type], ...]) -> tuple[tuple[str, types.Type], ...]:
        return tuple((name, types.unliteral(field)) for name, field in fields)


class BoundResidual(structref.StructRefProxy):
    """The arrays and constants of one step's residual decisions (``RESIDUAL_FIELDS``), held by one object."""


structref.define_proxy(BoundResidual, BoundResidualType, list(RESIDUAL_FIELDS))


@compiled
def _observe(b: Any, out: Any, budget: float, budget_plan: int, kernel: int, in_effect: int, pending: int,
             pending_age_s: float, elapsed_s: float, model_elapsed_s: float, auto_elapsed_s: float, drift_pct: float,
             last_latency_ratio: float) -> int:
    """The observation at a measured state (host seconds) under the standing order's margin, into ``out``; the
    fitting plan's pair."""
    margin = b.margins[min(b.action[2], b.margins.shape[0] - 1)]
    return observe_residual(out, b.obs, b.advice, b.static_rows, b.lay, b.advisor_index, b.cumulative_s, b.landings,
                            b.plan_pairs, b.plan_rest, b.joinable, b.next_change, b.speeds_up, b.sizes,
                            b.auto_time_s, b.latency_s, b.stall_s, budget, budget_plan, margin, b.errors, kernel,
                            in_effect, pending, pending_age_s, elapsed_s, model_elapsed_s, auto_elapsed_s, drift_pct,
                            last_latency_ratio)


@compiled
def _standing(b: Any, fitting: int) -> int:
    """The standing order's pair: its residual over the fitting plan's pair ``fitting``."""
    return residual_pair(fitting, b.core_steps[b.action[0]], b.memory_steps[b.action[1]], b.levels, b.memories)


@compiled
def _evaluate(b: Any, budget: float, budget_plan: int, kernel: int, in_effect: int, pending: int,
              pending_age_s: float, elapsed_s: float, model_elapsed_s: float, auto_elapsed_s: float, drift_pct: float,
              last_latency_ratio: float, fitting: int) -> int:
    """Run the policy on the observation in ``out`` (``fitting``: its fitting pair), as the environment's step
    does: act, keep the prediction error measured here, then the new order's pair (auto, released, for the
    release; the fitting pair anew only if the margin changed)."""
    b.acted_on[:] = b.out
    margin = b.action[2]
    b.action[:] = act(b.first, b.acted_on, b.mean, b.inverse_std, b.clip, b.products, b.picks, b.later, b.bounds,
                      b.activation)
    _, error = budget_use_of(elapsed_s, model_elapsed_s, auto_elapsed_s, drift_pct)
    for j in range(b.errors.shape[0] - 1, 0, -1):
        b.errors[j] = b.errors[j - 1]
    b.errors[0] = 100.0 * error
    if b.action[2] == b.margins.shape[0]:  # the release
        b.counters[RELEASED] = 1
        return 0
    if b.action[2] != margin:
        fitting = _observe(b, b.out, budget, budget_plan, kernel, in_effect, pending, pending_age_s, elapsed_s,
                           model_elapsed_s, auto_elapsed_s, drift_pct, last_latency_ratio)
    return _standing(b, fitting)


@compiled
def _budget_event(b: Any, auto_elapsed_s: float) -> bool:
    """Whether the position passed the next budget event (then the one after is next)."""
    progress = auto_elapsed_s / b.event_time_s
    if not b.events or progress < b.counters[NEXT_EVENT] / b.events - EPS:
        return False
    b.counters[NEXT_EVENT] = int(progress * b.events) + 1
    return True


@compiled
def host_times(pending_age_s: float, elapsed_s: float, drift_pct: float) -> tuple[float, float]:
    """A :class:`~kdvfs.envs.env.observing.live.LiveState`'s request age and elapsed time (host over the measured
    auto scale) back in host seconds, as the environment's :class:`~kdvfs.envs.env.observing.measured.MeasuredState`
    holds them (the other times are the same in both)."""
    scale = 1.0 + drift_pct / 100.0
    return pending_age_s * scale, elapsed_s * scale


@compiled
def begin_bound(b: Any, budget: float, budget_plan: int, drift_pct: float) -> int:
    """Start a step: no errors measured, the first budget event next, not released, the policy's first decision
    at kernel 0 (auto in effect, ``drift_pct`` measured); its pair (0, auto, for a release)."""
    b.errors[:] = 0.0
    b.counters[NEXT_EVENT], b.counters[RELEASED] = 1, 0
    b.action[:] = 0
    fitting = _observe(b, b.out, budget, budget_plan, 0, 0, -1, 0.0, 0.0, 0.0, 0.0, drift_pct, 1.0)
    return _evaluate(b, budget, budget_plan, 0, 0, -1, 0.0, 0.0, 0.0, 0.0, drift_pct, 1.0, fitting)


@compiled
def decide_residual(b: Any, budget: float, budget_plan: int, kernel: int, in_effect: int, pending: int,
                    pending_age_s: float, elapsed_s: float, auto_elapsed_s: float, last_latency_ratio: float,
                    drift_pct: float, model_elapsed_s: float) -> tuple[int, bool]:
    """The decision at a live state (``kernel`` to ``model_elapsed_s``: ``LiveState``'s fields): the pair the
    standing order names and whether the policy ran (at a budget event, or where the order names a pair other than
    ``in_effect`` with nothing pending); a released step names auto and runs nothing."""
    if b.counters[RELEASED]:
        return 0, False
    pending_age_s, elapsed_s = host_times(pending_age_s, elapsed_s, drift_pct)
    fitting = _observe(b, b.out, budget, budget_plan, kernel, in_effect, pending, pending_age_s, elapsed_s,
                       model_elapsed_s, auto_elapsed_s, drift_pct, last_latency_ratio)
    pair = _standing(b, fitting)
    evaluated = _budget_event(b, auto_elapsed_s) or (pending < 0 and pair != in_effect)
    if evaluated:
        pair = _evaluate(b, budget, budget_plan, kernel, in_effect, pending, pending_age_s, elapsed_s,
                         model_elapsed_s, auto_elapsed_s, drift_pct, last_latency_ratio, fitting)
    return pair, evaluated


@compiled
def warm_residual(b: Any, budget: float, budget_plan: int, kernel: int, in_effect: int, pending: int,
                  pending_age_s: float, elapsed_s: float, auto_elapsed_s: float, last_latency_ratio: float,
                  drift_pct: float, model_elapsed_s: float) -> None:
    """A decision's observation (into ``scratch``) and policy run at a live state, dropped: nothing of the step's
    decisions changes."""
    pending_age_s, elapsed_s = host_times(pending_age_s, elapsed_s, drift_pct)
    _observe(b, b.scratch, budget, budget_plan, kernel, in_effect, pending, pending_age_s, elapsed_s,
             model_elapsed_s, auto_elapsed_s, drift_pct, last_latency_ratio)
    act(b.first, b.scratch, b.mean, b.inverse_std, b.clip, b.products, b.picks, b.later, b.bounds, b.activation)


@compiled
def first_change_residual(b: Any, budget: float, budget_plan: int, kernels: Any, in_effect: int, elapsed_s: Any,
                          auto_elapsed_s: Any, last_latency_ratio: float, drift_pct: float,
                          model_elapsed_s: Any) -> int:
    """The first of the states ahead (``kernels`` (n,) int64 and their times (n,) float64: ``LiveState``'s
    fields, nothing pending) at which a decision is due: the position passes the next budget event or the
    standing order names a pair other than ``in_effect``; n if none or released. Observes into ``scratch``."""
    n = kernels.shape[0]
    if b.counters[RELEASED]:
        return n
    event_s = (b.counters[NEXT_EVENT] / b.events - EPS) * b.event_time_s if b.events else np.inf
    for j in range(n):
        if auto_elapsed_s[j] >= event_s:
            return j
        _, host_elapsed_s = host_times(0.0, elapsed_s[j], drift_pct)
        fitting = _observe(b, b.scratch, budget, budget_plan, kernels[j], in_effect, -1, 0.0, host_elapsed_s,
                           model_elapsed_s[j], auto_elapsed_s[j], drift_pct, last_latency_ratio)
        if _standing(b, fitting) != in_effect:
            return j
    return n
