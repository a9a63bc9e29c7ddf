"""The observation at a state (:func:`observe_at`), and what a controller's live decision reads of the
environment, gathered once, with the compiled parts of that decision.

:func:`observe_at` is the observation, of the state the environment simulates and of the state a controller
measures alike. A live decision (:mod:`kdvfs.agents.learned.policy.online`) runs in one compiled call: it writes the
observation at the measured state (:func:`observe_at`), runs the policy and names the pair to request
(:func:`target_pair_of`, which the environment's
:meth:`~kdvfs.envs.env.dvfs_env.KernelDVFSEnv.target_pair` calls too) and where its standing order's proposal
can next change (:func:`plan_of`, :func:`next_change_in`).

:class:`LiveTables` holds the arrays for one step and switching regime: the environment's observation
buffers and layout, every pair's landing kernels and every (pair, plan)'s proposal changes, packed into
arrays a compiled function takes (:meth:`~kdvfs.envs.env.dvfs_env.KernelDVFSEnv.live_tables`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.compiled import compiled
from kdvfs.envs.env.observing.dynamic_observation import observe_dynamic, observe_plans

DEPENDS_ON_BUDGET = -2
""":func:`plan_of` (and a live decision's next change): the standing order's proposal depends on the budget."""
NO_PLAN = -1
""":func:`plan_of`: no plan to follow (no request, a fixed pair, no plan within the budget)."""
(S_KERNELS, S_PLANS, S_PLAN_START, S_PLAN_STOP, S_BUDGET_SLOT) = range(5)
"""Entries of :attr:`LiveTables.sizes`."""


@dataclass(frozen=True)
class LiveTables:
    """The environment's arrays a live decision reads, for one step and switching regime.

    Attributes:
        obs, advice: the environment's observation (N,) float32 and advisors' pairs (A,) int64 buffers.
        static_rows: (K + 1, static size) float32 static part at each kernel.
        layout: :func:`~kdvfs.envs.env.observing.dynamic_observation.layout`; advisor_index: its advisor index.
        cumulative_s: (K + 1, G) float64 kernel starts at each pair (model s).
        landings: (G, 2, K + 1) int64 landing kernels (earliest, next) on the timeline of each pair in effect.
        plan_pairs, plan_rest, joinable, next_change, speeds_up: the step's plan advice tables.
        change_offsets: (G * P + 1,) int64 where (pair, plan)'s proposal changes start in ``change_kernels``
            (at ``pair * P + plan``); change_kernels: the changes, sorted per (pair, plan).
        sizes: (5,) int64: kernels K, plans P, the plan advisors' first and past-last slot, the budget plan's
            slot (``S_*``).
        auto_time_s, latency_s, stall_s: the step's auto time, the mean switching latency and the stall per
            clock change (s, model timeline).
    """

    obs: Array
    advice: Array
    static_rows: Array
    layout: Array
    advisor_index: Array
    cumulative_s: Array
    landings: Array
    plan_pairs: Array
    plan_rest: Array
    joinable: Array
    next_change: Array
    speeds_up: Array
    change_offsets: Array
    change_kernels: Array
    sizes: Array
    auto_time_s: float
    latency_s: float
    stall_s: float

    def arrays(self) -> tuple[Array | float, ...]:
        """The fields in order: the leading arguments of a compiled live decision."""
        return (self.obs, self.advice, self.static_rows, self.layout, self.advisor_index, self.cumulative_s,
                self.landings, self.plan_pairs, self.plan_rest, self.joinable, self.next_change, self.speeds_up,
                self.change_offsets, self.change_kernels, self.sizes, self.auto_time_s, self.latency_s, self.stall_s)


@compiled
def target_pair_of(choice: int, advice: Array, sizes: Array) -> int:
    """The grid pair a plan choice names at this decision point (its advisor's proposal now)."""
    return advice[sizes[S_PLAN_START] + choice]


@compiled
def plan_of(request: int, choice: int, budget_plan: int, sizes: Array) -> int:
    """The plan whose proposals the action (``request``, ``choice``) follows; ``NO_PLAN`` where its pair
    cannot change (no request, no plan within the budget), ``DEPENDS_ON_BUDGET`` for the fitting plan."""
    slot = sizes[S_PLAN_START] + choice
    if not request:
        return NO_PLAN
    if slot < sizes[S_PLAN_STOP]:
        plan = slot - sizes[S_PLAN_START]
    elif slot == sizes[S_BUDGET_SLOT]:
        plan = budget_plan
    else:
        return DEPENDS_ON_BUDGET
    return max(plan, NO_PLAN)


@compiled
def next_change_in(changes: Array, k: int, kernels: int) -> int:
    """The first of the sorted ``changes`` after kernel ``k``; ``kernels`` if none."""
    after = np.searchsorted(changes, k, side="right")
    return changes[after] if after < changes.shape[0] else kernels


@compiled
def observe_at(obs: Array, advice: Array, static_rows: Array, lay: Array, advisor_index: Array,
               cumulative_s: Array, landings: Array, plan_pairs: Array, plan_rest: Array, joinable: Array,
               next_change: Array, speeds_up: Array, sizes: Array, auto_time_s: float, latency_s: float,
               stall_s: float, budget: float, budget_plan: int, kernel: int, in_effect: int, pending: int,
               pending_age_s: float, elapsed_s: float, auto_elapsed_s: float, last_latency_ratio: float,
               drift_pct: float, model_elapsed_s: float) -> int:
    """The observation: write its dynamic part into ``obs`` and each advisor's pair into ``advice`` at a state
    (the arguments after ``budget_plan``: :class:`~kdvfs.envs.env.observing.live.LiveState`'s fields), the one function
    both the environment (on the state it simulates, :meth:`~kdvfs.envs.env.dvfs_env.KernelDVFSEnv.live_state`)
    and a controller (on the state it measures) call. The static part is ``static_rows`` at the returned kernel
    (``kernel`` within [0, K]; K: the step is over). The leading arguments are :class:`LiveTables`' (through
    ``stall_s``, without the proposal changes), ``landings`` holding the row of ``in_effect``."""
    k = min(max(kernel, 0), sizes[S_KERNELS])
    observe_dynamic(obs, advice, static_rows[k], lay, advisor_index, cumulative_s, landings[in_effect, 0],
                    landings[in_effect, 1], plan_pairs, plan_rest, joinable, next_change, speeds_up, k, in_effect,
                    pending, latency_s - pending_age_s, elapsed_s, auto_elapsed_s, model_elapsed_s,
                    last_latency_ratio, drift_pct, budget, auto_time_s, latency_s, stall_s, budget_plan)
    return k


@compiled
def plans_at(obs: Array, advice: Array, lay: Array, cumulative_s: Array, landings: Array, plan_pairs: Array,
             plan_rest: Array, joinable: Array, next_change: Array, speeds_up: Array, sizes: Array, auto_time_s: float,
             stall_s: float, budget: float, budget_plan: int, kernel: int, in_effect: int, elapsed_s: float,
             auto_elapsed_s: float, model_elapsed_s: float) -> int:
    """:func:`observe_at`'s plan advisors alone (:func:`~kdvfs.envs.env.observing.dynamic_observation.observe_plans`):
    their pairs in ``advice`` (the plans', the fitting plan's, the budget plan's slots) as :func:`observe_at` writes
    them at the same state; the rest of ``obs`` and ``advice`` is left as it was. Returns the kernel, as
    :func:`observe_at` does."""
    k = min(max(kernel, 0), sizes[S_KERNELS])
    observe_plans(obs, advice, lay, cumulative_s, landings[in_effect, 0], landings[in_effect, 1], plan_pairs,
                  plan_rest, joinable, next_change, speeds_up, k, in_effect, elapsed_s, auto_elapsed_s,
                  model_elapsed_s, budget, auto_time_s, stall_s, budget_plan)
    return k
