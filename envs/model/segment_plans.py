"""Cheapest piecewise-constant clock schedules under switching latency, for given prices of time.

A schedule is a sequence of segments of consecutive kernels, each run at one action. Two changes closer
than the switching latency L cannot both take effect on time, so when there is more than one segment
every segment must last at least L at its own action (idle gaps included). Each change stalls the GPU for
``stall_s`` at the idle power of the action entered.

For a price of time lam >= 0 (J/s), the schedule minimising energy + lam * time is an exact dynamic
programme over segment ends:

    F[k] = min_a min_{j <= J(k, a)} F[j] - C[j, a] + C[k, a] + switch(a)

with C the prefix sums of (energy + lam * time) per action and J(k, a) the last segment start that keeps
the segment [j, k) at least L long (and non-empty); a running prefix minimum over j makes it O(K * A) per
lam. :func:`segment_plans` solves many prices at once (compiled, without the interpreter lock). The
latency-aware optimum (``kdvfs.agents.planners.latency_optimal``) searches the price that meets a time budget; the
environment shows the plans of a fixed grid of prices to the agent as advisors.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.envs.model.schedule import ActionCosts, switch_points


def segment_starts(time_s: Array, latency_s: float) -> Array:
    """(K + 1, A) J[k, a]: the last j < k with sum(time_s[j:k, a]) >= latency_s (-1 if none)."""
    # Time before each kernel at each action; a segment [j, k) lasts cum_time[k] - cum_time[j].
    cum_time = np.vstack([np.zeros(time_s.shape[1]), np.cumsum(time_s, axis=0)])
    # Per action, the last j with cum_time[j] <= cum_time[k] - latency (-1 if even j = 0 is too late).
    starts = np.empty(cum_time.shape, dtype=np.int64)
    for action in range(cum_time.shape[1]):
        column = cum_time[:, action]
        starts[:, action] = np.searchsorted(column, column - latency_s, side="right") - 1
    # At least one kernel per segment (j < k), also where the latency is 0.
    return np.minimum(starts, np.arange(len(cum_time))[:, None] - 1)


def segment_plans(costs: ActionCosts, prices_j_per_s: Array, stall_s: float, starts: Array,
                  switchable: Array | None = None) -> Array:
    """(P, K) the cheapest valid schedule of energy + price * time for each of P prices.

    Args:
        costs: per-kernel time and energy of every action, and the idle power of a change's stall.
        prices_j_per_s: (P,) prices of time lam (J/s), >= 0.
        stall_s: GPU stall per change (s).
        starts: :func:`segment_starts` of ``costs.time_s`` for the switching latency.
        switchable: (K + 1,) bool, kernels where a change may take effect (None: all).
    """
    prices = np.asarray(prices_j_per_s, dtype=float)
    kernels = costs.time_s.shape[0]
    switch = stall_s * (costs.idle_power_w[None, :] + prices[:, None])  # a change's cost (its stall)
    totals, best, choice = _compiled_programme()(
        costs.time_s, costs.energy_j, prices, switch, starts.astype(np.int64),
        np.ones(kernels + 1, dtype=np.bool_) if switchable is None else switchable)
    # Backtrack each price's segments, unless one action throughout is at least as cheap (no latency limit).
    single = totals.argmin(axis=1)
    plans = np.empty((len(prices), kernels), dtype=np.int64)
    for p in range(len(prices)):
        single_is_best = totals[p, single[p]] <= best[kernels, p]
        plans[p] = single[p] if single_is_best else _backtrack(choice[:, p], kernels)
    return plans


@functools.cache
def _compiled_programme() -> Any:
    """:func:`_programme` compiled without the interpreter lock, on first use: importing this module loads no
    compiler (light commands and the privileged daemon import it; a hardened process may forbid JIT memory)."""
    from kdvfs.common.compiled import compiled_without_gil

    return compiled_without_gil(_programme)


def _programme(time_s: Array, energy_j: Array, prices: Array, switch: Array, starts: Array, switchable: Array
               ) -> tuple[Array, Array, Array]:
    """The dynamic programme of the module docstring over every price at once, run compiled and without the
    interpreter lock (:func:`_compiled_programme`): a bucket prepared on a background thread does not hold up
    the training loop.

    Args:
        time_s, energy_j: (K, A) per kernel and action.
        prices: (P,) prices of time (J/s).
        switch: (P, A) the cost of entering each action (its stall).
        starts: (K + 1, A) :func:`segment_starts`.
        switchable: (K + 1,) bool, kernels where a change may take effect.

    Returns:
        (P, A) C[K]: each action's energy + price * time over the whole step; (K + 1, P) F[k]: the cheapest
        schedule of kernels [0, k); (K + 1, P, 2) the last segment chosen at each k (its start, its action).
    """
    kernels, actions, plans_count = time_s.shape[0], time_s.shape[1], prices.shape[0]
    # C[k, p, a], the prefix sums of energy + price * time, as a running row (each k reads only its own).
    cum_cost = np.zeros((plans_count, actions))
    best = np.zeros((kernels + 1, plans_count))
    # prefix_min[j, p, a]: min over j' <= j of F[j'] - C[j', a] + switch(a) (entering action a at j'), with the
    # j' that attains it; j' = 0 enters at no cost (the step's first clocks are free).
    prefix_min = np.full((kernels + 1, plans_count, actions), np.inf)
    prefix_arg = np.zeros((kernels + 1, plans_count, actions), dtype=np.int64)
    prefix_min[0] = 0.0
    choice = np.zeros((kernels + 1, plans_count, 2), dtype=np.int64)
    for k in range(1, kernels + 1):
        for p in range(plans_count):
            for a in range(actions):
                cum_cost[p, a] += energy_j[k - 1, a] + prices[p] * time_s[k - 1, a]
            # The best last segment [j, k) over the actions, its start at most J(k, a) (the first at a tie).
            chosen, cheapest = 0, np.inf
            for a in range(actions):
                if starts[k, a] >= 0:
                    candidate = prefix_min[starts[k, a], p, a] + cum_cost[p, a]
                    if candidate < cheapest:
                        chosen, cheapest = a, candidate
            best[k, p] = cheapest
            choice[k, p, 0] = prefix_arg[max(starts[k, chosen], 0), p, chosen]
            choice[k, p, 1] = chosen
            # Extend the running minimum with a segment entered at k (only where a change may take effect).
            for a in range(actions):
                entry = cheapest - cum_cost[p, a] + (switch[p, a] if switchable[k] else np.inf)
                if entry < prefix_min[k - 1, p, a]:
                    prefix_min[k, p, a], prefix_arg[k, p, a] = entry, k
                else:
                    prefix_min[k, p, a], prefix_arg[k, p, a] = prefix_min[k - 1, p, a], prefix_arg[k - 1, p, a]
    return cum_cost, best, choice


def _backtrack(choice: Array, kernels: int) -> Array:
    """The segments chosen by the programme, from the step's end back to its start."""
    plan = np.empty(kernels, dtype=np.int64)
    end = kernels
    while end > 0:
        start, action = choice[end]
        plan[start:end] = action
        end = start
    return plan


def plan_totals(costs: ActionCosts, plans: Array, stall_s: float) -> tuple[Array, Array]:
    """(P,) time (s) and (P,) energy (J) of ``plans`` (P, K) run as planned, one stall per change."""
    rows = np.arange(plans.shape[1])
    # A change at kernel k (k > 0) stalls the GPU at the idle power of the action entered.
    changed = np.zeros(plans.shape, dtype=bool)
    changed[:, 1:] = plans[:, 1:] != plans[:, :-1]
    time_s = costs.time_s[rows, plans].sum(axis=1) + stall_s * changed.sum(axis=1)
    stall_j = stall_s * np.where(changed, costs.idle_power_w[plans], 0.0).sum(axis=1)
    energy_j = costs.energy_j[rows, plans].sum(axis=1) + stall_j
    return time_s, energy_j


@dataclass(frozen=True)
class BudgetPlans:
    """The cheapest schedules found within P time budgets by :func:`cheapest_within`.

    Attributes:
        plans: (P, K) actions per kernel (the auto action everywhere where no schedule fits).
        prices_j_per_s: (P,) the price of time of the cheapest Lagrangian plan found within each budget (NaN
            where none fits; kept where a single action replaced that plan).
        energy_j: (P,) each plan's energy as planned (J).
        lower_bounds_j: (P,) the best Lagrangian lower bound on the energy within each budget (J).
        feasible: (P,) whether a schedule within the budget was found.
    """

    plans: Array
    prices_j_per_s: Array
    energy_j: Array
    lower_bounds_j: Array
    feasible: Array


def cheapest_within(costs: ActionCosts, budgets_s: Array, stall_s: float, starts: Array, iterations: int,
                    first_price_j_per_s: float = 1.0, max_price_j_per_s: float = 1e9,
                    switchable: Array | None = None) -> BudgetPlans:
    """For each time budget, the cheapest schedule of :func:`segment_plans` (or single action) within it,
    found by bisection on the price of time (all budgets at once).

    The price starts at 0 (no time constraint); where that overruns, it grows by 4x from
    ``first_price_j_per_s`` until the budget is met (giving up beyond ``max_price_j_per_s``), then
    ``iterations`` bisection steps keep the cheapest feasible plan seen. Every price probed also gives a
    Lagrangian lower bound, energy + price * (time - budget), on the constrained optimum (of schedules
    changing only at ``switchable`` kernels, if given).
    """
    budgets_s = np.asarray(budgets_s, dtype=float)
    count = len(budgets_s)
    low, high = np.zeros(count), np.zeros(count)
    best = BudgetPlans(np.full((count, costs.kernels), costs.auto_index), np.full(count, np.nan),
                       np.full(count, np.inf), np.full(count, -np.inf), np.zeros(count, dtype=bool))

    def probe(prices: Array) -> Array:
        """Plans at ``prices`` (P,): raise the lower bounds, keep the cheapest fitting plans; which fit."""
        plans = segment_plans(costs, prices, stall_s, starts, switchable)
        time_s, energy_j = plan_totals(costs, plans, stall_s)
        np.maximum(best.lower_bounds_j, energy_j + prices * (time_s - budgets_s), out=best.lower_bounds_j)
        fits = time_s <= budgets_s
        better = fits & (energy_j < best.energy_j)
        best.plans[better], best.prices_j_per_s[better], best.energy_j[better] = \
            plans[better], prices[better], energy_j[better]
        best.feasible[fits] = True
        return fits

    # Bracket: price 0 first; where that overruns, grow the price 4x until the plan fits (or give up).
    searching = ~probe(high)
    high[searching] = first_price_j_per_s
    while searching.any() and high[searching].max() <= max_price_j_per_s:
        fits = probe(high)
        searching &= ~fits
        low[searching], high[searching] = high[searching], 4.0 * high[searching]
    # Bisect each bracket [low (overruns), high (fits)]; probe keeps the cheapest fitting plan seen.
    for _ in range(iterations if best.feasible.any() else 0):
        middle = 0.5 * (low + high)
        fits = probe(middle)
        high, low = np.where(fits, middle, high), np.where(fits, low, middle)
    _keep_cheaper_single_actions(costs, budgets_s, best)
    return best


def _keep_cheaper_single_actions(costs: ActionCosts, budgets_s: Array, best: BudgetPlans) -> None:
    """Replace a plan by a one-action schedule where one fits the budget for less energy (single actions
    need not be Lagrangian vertices)."""
    time_s, energy_j = costs.time_s.sum(axis=0), costs.energy_j.sum(axis=0)
    for p, budget_s in enumerate(budgets_s):
        fitting = np.flatnonzero(time_s <= budget_s)
        if len(fitting):
            action = int(fitting[energy_j[fitting].argmin()])
            if energy_j[action] < best.energy_j[p]:
                best.plans[p], best.energy_j[p], best.feasible[p] = action, energy_j[action], True


def segments_ok(time_s: Array, actions: Array, latency_s: float) -> bool:
    """True if every segment of a multi-segment schedule ``actions`` (K,) lasts at least ``latency_s``."""
    bounds = np.r_[0, switch_points(actions), len(actions)]
    if len(bounds) == 2:
        return True
    # Each segment's duration: the sum of its kernels' times at its action.
    durations = np.add.reduceat(time_s[np.arange(len(actions)), actions], bounds[:-1])
    return bool(np.all(durations >= latency_s - 1e-12))
