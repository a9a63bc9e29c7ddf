"""A frozen policy's live decision in one compiled call: observation, policy run, pair, next proposal change.

:meth:`~kdvfs.agents.learned.policy.online.OnlinePolicy.decide` calls :func:`decide_bound` (:func:`decide_live` on
the arrays a :class:`BoundDecision` holds) once per decision point, and ``first_change`` calls
:func:`first_change_bound`: the standing order's proposal at each of a run of states ahead (where it depends
on the budget, re-read as the step goes) until it names a pair to request. A decision point's Python runs
slowest on a core that slept through the gap, so as little as possible stays in Python: the environment's part
(:func:`~kdvfs.envs.env.observing.live_tables.observe_at`,
:func:`~kdvfs.envs.env.observing.live_tables.target_pair_of`, :func:`~kdvfs.envs.env.observing.live_tables.plan_of`,
:func:`~kdvfs.envs.env.observing.live_tables.next_change_in`: the functions the environment itself calls) and
the policy's (:func:`~kdvfs.agents.learned.policy.forward.act`) run in one call, on arrays bound once
(:class:`BoundDecision`: one argument for numba's dispatch to walk, not ~47, since the dispatch's cost grows with
the arguments). The timings behind this are in ``docs/results.md``.
"""

from __future__ import annotations

from typing import Any

from numba.core import types
from numba.experimental import structref

from kdvfs.agents.learned.policy.forward import act
from kdvfs.common.arrays import Array
from kdvfs.common.compiled import compiled
from kdvfs.envs.env.observing.live_tables import (
    DEPENDS_ON_BUDGET,
    NO_PLAN,
    S_KERNELS,
    S_PLANS,
    next_change_in,
    observe_at,
    plan_of,
    plans_at,
    target_pair_of,
)
from kdvfs.envs.env.observing.observation import BUDGET_FEATURES

NO_REQUEST = -1
"""The pair of a decision that requests nothing."""
USED, AFFORDABLE = BUDGET_FEATURES.index("budget_used"), BUDGET_FEATURES.index("affordable_slowdown_pct")
(O_ENTRIES, O_IN_EFFECT_ROWS, O_PENDING_ROWS, O_BUDGET) = range(4)
"""Entries of ``offsets``: where the entries multiplied at each call start in the observation, the rows of
``products`` for the pair in effect and pending (of pair -1: none), the budget block's start."""


@compiled
def decide_live(obs: Array, advice: Array, static_rows: Array, lay: Array, advisor_index: Array,
                cumulative_s: Array, landings: Array, plan_pairs: Array, plan_rest: Array, joinable: Array,
                next_change: Array, speeds_up: Array, change_offsets: Array, change_kernels: Array, sizes: Array,
                auto_time_s: float, latency_s: float, stall_s: float, first: tuple[Array, Array, Array], mean: Array,
                inverse_std: Array, clip: float, later: tuple[tuple[Array, Array, Array], ...], bounds: Array,
                activation: int, products: Array, offsets: Array, budget: float, budget_plan: int, kernel: int,
                in_effect: int, pending: int, pending_age_s: float, elapsed_s: float, auto_elapsed_s: float,
                last_latency_ratio: float, drift_pct: float, model_elapsed_s: float, evaluate: bool, action: Array,
                picks: Array) -> tuple[int, int, float, float]:
    """The decision at a live state (``kernel`` to ``model_elapsed_s``:
    :class:`~kdvfs.envs.env.observing.live.LiveState`'s fields): writes the observation's dynamic part and the advice
    (the environment's buffers), runs the policy into ``action`` (parts,) int64 if ``evaluate`` (else ``action`` is
    the standing order), and returns the pair it names (``NO_REQUEST``: none), the kernel where its proposal can next
    change (K: never; ``DEPENDS_ON_BUDGET``), and the observation's budget used and affordable slowdown (%).

    The arguments: :meth:`~kdvfs.envs.env.observing.live_tables.LiveTables.arrays`, then
    :meth:`~kdvfs.agents.learned.policy.frozen.FrozenPolicy.forward_inputs`, ``products`` (rows of the first layer's
    product with the static part at each kernel and with the clock blocks of each pair in effect and pending,
    :meth:`~kdvfs.agents.learned.policy.frozen.FrozenPolicy.first_products`), ``offsets`` (``O_*``), the step's budget
    (fraction) and budget plan, the state, ``evaluate``, ``action``, and ``picks`` (3,) int64 scratch.
    """
    k = observe_at(obs, advice, static_rows, lay, advisor_index, cumulative_s, landings, plan_pairs, plan_rest,
                   joinable, next_change, speeds_up, sizes, auto_time_s, latency_s, stall_s, budget, budget_plan,
                   kernel, in_effect, pending, pending_age_s, elapsed_s, auto_elapsed_s, last_latency_ratio,
                   drift_pct, model_elapsed_s)
    if evaluate:
        picks[0], picks[1], picks[2] = k, offsets[O_IN_EFFECT_ROWS] + in_effect, offsets[O_PENDING_ROWS] + pending
        action[:] = act(first, obs[offsets[O_ENTRIES]:], mean, inverse_std, clip, products, picks, later, bounds,
                        activation)
    pair = target_pair_of(action[1], advice, sizes) if action[0] else NO_REQUEST
    plan = plan_of(action[0], action[1], budget_plan, sizes)
    change = sizes[S_KERNELS]
    if plan == DEPENDS_ON_BUDGET:
        change = DEPENDS_ON_BUDGET
    elif plan != NO_PLAN:
        at = in_effect * sizes[S_PLANS] + plan
        change = next_change_in(change_kernels[change_offsets[at]:change_offsets[at + 1]], k, sizes[S_KERNELS])
    return pair, change, float(obs[offsets[O_BUDGET] + USED]), float(obs[offsets[O_BUDGET] + AFFORDABLE])


BOUND_FIELDS = ("obs", "advice", "static_rows", "lay", "advisor_index", "cumulative_s", "landings", "plan_pairs",
                "plan_rest", "joinable", "next_change", "speeds_up", "change_offsets", "change_kernels", "sizes",
                "auto_time_s", "latency_s", "stall_s", "first", "mean", "inverse_std", "clip", "later", "bounds",
                "activation", "products", "offsets", "action", "picks")
""":func:`decide_live`'s arguments that stay from decision to decision, in its order."""


@structref.register
class BoundDecisionType(types.StructRef):
    """numba's type of :class:`BoundDecision`."""

    def preprocess_fields(self, fields: tuple[tuple[str, types.Type], ...]) -> tuple[tuple[str, types.Type], ...]:
        return tuple((name, types.unliteral(field)) for name, field in fields)


class BoundDecision(structref.StructRefProxy):
    """:func:`decide_live`'s arguments but the budget and the state (``BOUND_FIELDS``, the arrays and the
    constants of one step's decisions, ``action`` the standing order's buffer), held by one object."""


structref.define_proxy(BoundDecision, BoundDecisionType, list(BOUND_FIELDS))


@compiled
def decide_bound(bound: Any, budget: float, budget_plan: int, kernel: int, in_effect: int, pending: int,
                 pending_age_s: float, elapsed_s: float, auto_elapsed_s: float, last_latency_ratio: float,
                 drift_pct: float, model_elapsed_s: float, evaluate: bool) -> tuple[int, int, float, float]:
    """:func:`decide_live` with the arguments ``bound`` (a :class:`BoundDecision`) holds."""
    b = bound
    return decide_live(b.obs, b.advice, b.static_rows, b.lay, b.advisor_index, b.cumulative_s, b.landings,
                       b.plan_pairs, b.plan_rest, b.joinable, b.next_change, b.speeds_up, b.change_offsets,
                       b.change_kernels, b.sizes, b.auto_time_s, b.latency_s, b.stall_s, b.first, b.mean,
                       b.inverse_std, b.clip, b.later, b.bounds, b.activation, b.products, b.offsets, budget,
                       budget_plan, kernel, in_effect, pending, pending_age_s, elapsed_s, auto_elapsed_s,
                       last_latency_ratio, drift_pct, model_elapsed_s, evaluate, b.action, b.picks)


@compiled
def first_change_bound(bound: Any, budget: float, budget_plan: int, kernels: Array, in_effect: int,
                       elapsed_s: Array, auto_elapsed_s: Array, model_elapsed_s: Array) -> int:
    """The first of the states ahead (``kernels`` (n,) int64 and the times (n,) float64; no change pending,
    ``in_effect`` in effect: :class:`~kdvfs.envs.env.observing.live.LiveState`'s fields) at which the standing order
    (``bound.action``) proposes a pair other than ``in_effect``; n if none (or it requests nothing). Writes the plan
    advisors' part of the observation and of the advice at each (:func:`plans_at`: what the order's proposal reads;
    the environment's buffers, which every decision writes anew)."""
    b, n = bound, kernels.shape[0]
    if not b.action[0]:
        return n
    for j in range(n):
        plans_at(b.obs, b.advice, b.lay, b.cumulative_s, b.landings, b.plan_pairs, b.plan_rest, b.joinable,
                 b.next_change, b.speeds_up, b.sizes, b.auto_time_s, b.stall_s, budget, budget_plan, kernels[j],
                 in_effect, elapsed_s[j], auto_elapsed_s[j], model_elapsed_s[j])
        if target_pair_of(b.action[1], b.advice, b.sizes) != in_effect:
            return j
    return n
