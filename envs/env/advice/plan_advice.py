"""Plan advisors of ``KernelDVFS-v0``: latency-aware schedules of a step for a grid of budgets.

For each budget b, :func:`kdvfs.envs.model.segment_plans.cheapest_within` gives the cheapest schedule of the step
within b whose segments respect the switching latency (a vertex of the Lagrangian relaxation, found by
bisection on the price of time, on the policy's clock grid). At each decision point the environment shows,
for every plan, the pair it runs where a request made now would take effect and its saving and slowdown
from there to the step's end; the agent may request a plan's pair, or that of the plan saving the most
among those that fit the slowdown still affordable. Plans are computed once per step and latency (training
steps repeat; the runtime knows the captured step): about a second for a 2,000-kernel step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.envs.env.observing.observation import OBS_LIMIT
from kdvfs.envs.env.steps.step_data import StepData
from kdvfs.envs.model.schedule import switch_points
from kdvfs.envs.model.segment_plans import cheapest_within, segment_starts

EPS = 1e-12
"""Tolerance on times (s) when finding where a request lands."""
PLAN_BISECTIONS = 16
"""Bisection steps on the price of time per plan (after bracketing by 4x steps: about 0.03% of the price)."""


@dataclass(frozen=True)
class PlanAdvice:
    """Every plan's advice for joining it at each kernel of a step (P plans, K kernels; row K: the step's end).

    Attributes:
        pairs: (K + 1, P) int grid action each plan runs at kernel j (0, auto, at the end).
        rest_pct: (K + 1, 2 * P) float32 each plan's energy saving (%), then slowdown (%), against auto from
            kernel j to the step's end (stalls of its changes after j included; 0 at the end; clipped to the
            observation's limits).
        joinable: (K + 1, P) bool whether the plan, joined at kernel j, keeps that pair until a request made
            then could follow its next change (a plan whose pair is already in effect can always be followed).
        next_change: (K + 1, P) int the first kernel after j where the plan changes pair (K if none).
        speeds_up: (K + 1, P) bool whether that change makes the kernels of the next segment faster (a
            request for it may come early: it costs energy, not time).
    """

    pairs: Array
    rest_pct: Array
    joinable: Array
    next_change: Array
    speeds_up: Array

    def advice_pairs(self, effect: int | Array, next_effect: int | Array) -> Array:
        """(P,) each plan's pair for a request taking effect at kernel ``effect`` when the next request could
        only take effect at ``next_effect``: the pair after the plan's next change if that change speeds
        up and would come too late by then, else the pair at ``effect``. With (D,) arrays of both: (D, P)."""
        change = self.next_change[effect]
        last = next_effect[:, None] if isinstance(next_effect, np.ndarray) else next_effect
        early = self.speeds_up[effect] & (change < last)
        if not early.any():
            return self.pairs[effect]
        return np.where(early, self.pairs[change, np.arange(change.shape[-1])], self.pairs[effect])

    def proposal_changes(self, plan: int, effect: Array, next_effect: Array) -> Array:
        """Sorted kernels j (1 <= j <= K) where plan ``plan``'s advice (:meth:`advice_pairs`) differs from its
        advice a decision point earlier, with the landing kernels ``effect`` and ``next_effect`` ((K + 1,)
        each, :func:`landing_kernels`) of one timeline: between them, following the plan asks nothing new."""
        return _changes(self.advice_pairs(effect, next_effect)[:, plan])

    def every_proposal_changes(self, effect: Array, next_effect: Array) -> list[Array]:
        """:meth:`proposal_changes` of every plan, in order, from one :meth:`advice_pairs` of all plans."""
        advice = self.advice_pairs(effect, next_effect)
        return [_changes(advice[:, plan]) for plan in range(advice.shape[1])]


def _changes(pairs: Array) -> Array:
    """Sorted kernels j >= 1 where ``pairs`` (K + 1,) differs from the kernel before."""
    return np.flatnonzero(pairs[1:] != pairs[:-1]) + 1


def budget_plans(step: StepData, budgets: tuple[float, ...], effect: Array, latency_s: float,
                 stall_s: float) -> Array:
    """(P, K) grid actions of the cheapest latency-aware schedule within each budget (fractions),
    changing clocks only at kernels where a request made at a kernel's start takes effect (``effect``,
    (K + 1,)); all auto where none fits."""
    switchable = np.zeros(step.kernels + 1, dtype=bool)
    switchable[effect] = True
    starts = segment_starts(step.time_s, latency_s)
    mean_power_w = step.auto_energy_j / step.auto_time_s
    found = cheapest_within(step.action_costs, (1.0 + np.asarray(budgets)) * step.auto_time_s, stall_s, starts,
                            PLAN_BISECTIONS, first_price_j_per_s=0.25 * mean_power_w, switchable=switchable)
    return found.plans


def plan_advice(step: StepData, budgets: tuple[float, ...], effect: Array, latency_s: float,
                stall_s: float) -> PlanAdvice:
    """The advice of the plans for ``budgets`` (see the module docstring).

    Args:
        step: the priced step.
        budgets: (P,) budgets of the plans (fractions, 0.01 = 1%).
        effect: (K + 1,) kernel where a request made before kernel j takes effect (K: beyond the step).
        latency_s: switching latency (s); segments of a multi-segment plan last at least this long.
        stall_s: GPU stall per change (s).
    """
    kernels = step.kernels
    if not budgets:
        empty = np.zeros((kernels + 1, 0), dtype=np.int64)
        return PlanAdvice(empty, empty.astype(np.float32), empty.astype(bool), empty, empty.astype(bool))
    plans = budget_plans(step, budgets, effect, latency_s, stall_s)
    pairs = np.vstack([plans.T, np.zeros(len(budgets), dtype=np.int64)])
    # Each plan's time and energy from kernel j to the end, (K + 1, P, 2), against auto's over the same rest:
    # saving then slowdown (%), 0 at the step's end.
    auto_rest = step.cumulative[-1, :, 0] - step.cumulative[:, :, 0]
    rest = np.stack([_rest_of_plan(step, plan, stall_s) for plan in plans], axis=1)
    safe_auto = np.where(auto_rest > 0, auto_rest, 1.0)
    saving = 100.0 * (1.0 - rest[..., 1] / safe_auto[:, None, 1])
    slowdown = 100.0 * (rest[..., 0] / safe_auto[:, None, 0] - 1.0)
    rest_pct = np.hstack([saving, slowdown])
    rest_pct[-1] = 0.0
    # Each plan's next change after j; joined at j, a plan can be followed if that change comes no earlier
    # than a request made at j could take effect.
    next_change = np.vstack([np.stack([_next_change(plan) for plan in plans], axis=1),
                             np.full(len(budgets), kernels)])
    joinable = next_change >= effect[:, None]
    return PlanAdvice(pairs, np.clip(rest_pct, -OBS_LIMIT, OBS_LIMIT).astype(np.float32), joinable, next_change,
                      _speeds_up(step, pairs, next_change))


def _speeds_up(step: StepData, pairs: Array, next_change: Array) -> Array:
    """(K + 1, P) whether each plan's next change runs the segment after it faster than the pair before."""
    columns = np.arange(pairs.shape[1])
    after = pairs[next_change, columns]
    segment_end = next_change[next_change, columns]
    times = step.cumulative[:, 0, :]
    after_s = times[segment_end, after] - times[next_change, after]
    before_s = times[segment_end, pairs] - times[next_change, pairs]
    return (after_s < before_s) & (next_change < step.kernels)


def _next_change(plan: Array) -> Array:
    """(K,) for each kernel, the first later kernel where ``plan`` changes action (K if none)."""
    changes = switch_points(plan)
    return np.append(changes, len(plan))[np.searchsorted(changes, np.arange(len(plan)), side="right")]


def _rest_of_plan(step: StepData, plan: Array, stall_s: float) -> Array:
    """(K + 1, 2) time (s) and energy (J) of ``plan`` from each kernel to the step's end, counting the stall
    of every change after that kernel."""
    rows = np.arange(step.kernels)
    per_kernel = np.stack([step.time_s[rows, plan], step.energy_j[rows, plan]], axis=1)
    changes = switch_points(plan)
    per_kernel[changes, 0] += stall_s
    per_kernel[changes, 1] += stall_s * step.idle_power_w[plan[changes]]
    rest = np.zeros((step.kernels + 1, 2))
    rest[:-1] = np.cumsum(per_kernel[::-1], axis=0)[::-1]
    return rest


def plan_for_budget(plan_budgets: tuple[float, ...], budget: float) -> int:
    """Index of the plan with the largest budget within ``budget`` (fractions), -1 if none is."""
    within = [i for i, b in enumerate(plan_budgets) if b <= budget + 1e-12]
    return max(within, key=lambda i: plan_budgets[i]) if within else -1


def landing_kernels(times_s: Array, latency_s: float, latency_std_s: float, decision_interval_s: float
                    ) -> tuple[Array, Array]:
    """Where requests land on a timeline ``times_s`` ((K + 1,) kernel starts, s), for a decision before each
    kernel j (row K: the step's end): the kernel where a request made then takes effect at the earliest
    (latency one spread below its mean; 0 at the step's first decision), and the one where a request made at
    the next decision point (the next kernel, at least one decision interval away) takes effect at the
    latest (one spread above); K if beyond the step. Both (K + 1,) int. Plans are followed with these: a
    slower pair only once even an early change lands in its segment, a faster one early enough for a late
    one."""
    kernels = len(times_s) - 1
    following_s = np.maximum(times_s[np.minimum(np.arange(1, kernels + 2), kernels)], times_s + decision_interval_s)
    earliest = times_s.searchsorted(times_s + max(latency_s - latency_std_s, 0.0) - EPS, side="left")
    latest = times_s.searchsorted(following_s + latency_s + latency_std_s - EPS, side="left")
    earliest[0] = 0
    return np.minimum(earliest, kernels), np.minimum(latest, kernels)
