"""Exact multiple-choice knapsack: pick one option per class, minimising energy within a time budget.

Solved exactly in three steps:

1. drop dominated options (another option of the class is no slower and no costlier);
2. Lagrangian relaxation of the budget (bisection on the multiplier lam) gives a lower bound LB and a
   feasible incumbent UB; an option whose reduced cost (energy + lam * time above its class's minimum)
   exceeds UB - LB cannot be in any optimum and is removed (reduced-cost fixing);
3. the remaining MILP is solved by HiGHS (``scipy.optimize.milp``) with a relative gap of 0, time in
   nanoseconds above each class's fastest option so the solver's feasibility tolerance cannot overrun the
   budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.native_output import native_stdout_to_stderr

_BISECTIONS = 60
MILP_TIME_LIMIT_S = 5.0
"""HiGHS stops here with its best solution and bound; the result reports the proven gap."""
FEASIBILITY_MARGIN_S = 1e-6
"""Budget tightening (s) that absorbs the solver's feasibility tolerance."""


def pareto_options(time_s: Array, energy_j: Array) -> Array:
    """Indices of the options (1-D arrays) not dominated by another one, by increasing time."""
    order = np.lexsort((energy_j, time_s))
    best = np.minimum.accumulate(energy_j[order])
    keep = np.r_[True, energy_j[order][1:] < best[:-1]]
    return order[keep]


def _pareto_mask(time_s: Array, energy_j: Array, allowed: Array) -> Array:
    mask = np.zeros_like(allowed)
    for g in range(time_s.shape[0]):
        usable = np.flatnonzero(allowed[g])
        mask[g, usable[pareto_options(time_s[g, usable], energy_j[g, usable])]] = True
    return mask


def _relaxed(time_s: Array, energy_j: Array, mask: Array, lam: float) -> tuple[Array, float, float]:
    """Per-class argmin of energy + lam * time: (choice, total time, total Lagrangian cost)."""
    cost = np.where(mask, energy_j + lam * time_s, np.inf)
    choice = np.argmin(cost, axis=1)
    rows = np.arange(len(choice))
    return choice, float(time_s[rows, choice].sum()), float(cost[rows, choice].sum())


def _dual(time_s: Array, energy_j: Array, mask: Array, budget_s: float) -> tuple[float, float, Array | None]:
    """Bisection on lam: (lam of the best bound, the bound LB, a feasible incumbent or None)."""
    rows = np.arange(time_s.shape[0])
    best_lam, best_bound, incumbent, incumbent_j = 0.0, -np.inf, None, np.inf

    def visit(lam: float) -> float:
        nonlocal best_lam, best_bound, incumbent, incumbent_j
        choice, total_s, total_cost = _relaxed(time_s, energy_j, mask, lam)
        if total_cost - lam * budget_s > best_bound:
            best_lam, best_bound = lam, total_cost - lam * budget_s
        energy = float(energy_j[rows, choice].sum())
        if total_s <= budget_s and energy < incumbent_j:
            incumbent, incumbent_j = choice, energy
        return total_s

    low, high = 0.0, 1.0
    if visit(low) > budget_s:
        while visit(high) > budget_s:
            low, high = high, high * 4.0
        for _ in range(_BISECTIONS):
            middle = 0.5 * (low + high)
            if visit(middle) <= budget_s:
                high = middle
            else:
                low = middle
    return best_lam, best_bound, incumbent


def _fill_slack(time_s: Array, energy_j: Array, mask: Array, choice: Array, budget_s: float) -> Array:
    """Improve a feasible choice: repeatedly take the single-class change that saves the most energy and
    still fits the remaining time."""
    choice = choice.copy()
    rows = np.arange(len(choice))
    for _ in range(len(choice)):
        slack = budget_s - time_s[rows, choice].sum()
        extra_s = time_s - time_s[rows, choice][:, None]
        saving = np.where(mask & (extra_s <= slack), energy_j[rows, choice][:, None] - energy_j, 0.0)
        group, option = np.unravel_index(np.argmax(saving), saving.shape)
        if saving[group, option] <= 0:
            break
        choice[group] = option
    return choice


@dataclass(frozen=True)
class MckpSolution:
    """Chosen option per class (G,), its energy (J), and a proven lower bound on the optimum (J)."""

    choice: Array
    energy_j: float
    lower_bound_j: float

    @property
    def relative_gap(self) -> float:
        """Proven distance from the optimum, as a fraction of the energy (0: proven optimal)."""
        return max(0.0, self.energy_j - self.lower_bound_j) / max(abs(self.energy_j), 1e-12)


def solve_mckp(time_s: Array, energy_j: Array, budget_s: float, allowed: Array | None = None) -> MckpSolution | None:
    """Optimal choice of one option per class within the budget, or None if none meets it.

    Args:
        time_s, energy_j: (G, O) time (s) and energy (J) of option o in class g.
        budget_s: upper bound on the summed time (s).
        allowed: optional (G, O) mask of usable options.
    """
    allowed = np.ones_like(time_s, dtype=bool) if allowed is None else allowed
    if not allowed.any(axis=1).all():
        return None
    mask = _pareto_mask(time_s, energy_j, allowed)
    fastest = np.where(mask, time_s, np.inf).min(axis=1)
    if fastest.sum() > budget_s - FEASIBILITY_MARGIN_S:
        return None
    lam, bound, incumbent = _dual(time_s, energy_j, mask, budget_s - FEASIBILITY_MARGIN_S)
    rows = np.arange(time_s.shape[0])
    if incumbent is not None:
        incumbent = _fill_slack(time_s, energy_j, mask, incumbent, budget_s - FEASIBILITY_MARGIN_S)
        slack = float(energy_j[rows, incumbent].sum()) - bound
        cost = np.where(mask, energy_j + lam * time_s, np.inf)
        mask &= cost - cost.min(axis=1, keepdims=True) <= slack + 1e-9 * max(1.0, abs(bound))
        mask[rows, incumbent] = True
    chosen = _milp(time_s, energy_j, mask, budget_s, fastest)
    candidates = [c for c in (chosen, incumbent) if c is not None and time_s[rows, c].sum() <= budget_s]
    if not candidates:
        return None
    best = min(candidates, key=lambda c: float(energy_j[rows, c].sum()))
    return MckpSolution(best, float(energy_j[rows, best].sum()), bound - lam * FEASIBILITY_MARGIN_S)


def _milp(time_s: Array, energy_j: Array, mask: Array, budget_s: float, fastest: Array) -> Array | None:
    """HiGHS on the remaining options: its best choice, or None if it found none in time."""
    from scipy.optimize import Bounds, LinearConstraint, milp  # slow to import: only when a MILP is solved
    from scipy.sparse import csr_matrix

    groups = time_s.shape[0]
    group_of, option_of = np.nonzero(mask)
    columns = np.arange(len(option_of))
    one_per_group = csr_matrix((np.ones(len(columns)), (group_of, columns)), shape=(groups, len(columns)))
    extra_s = time_s[group_of, option_of] - fastest[group_of]
    slack_s = budget_s - fastest.sum() - FEASIBILITY_MARGIN_S
    constraints = [LinearConstraint(one_per_group, 1, 1), LinearConstraint(extra_s[None, :], -np.inf, slack_s)]
    with native_stdout_to_stderr():  # HiGHS prints debug lines to descriptor 1: keep stdout for the caller's output
        result = milp(energy_j[group_of, option_of], constraints=constraints, integrality=np.ones(len(columns)),
                      bounds=Bounds(0, 1),
                      options={"mip_rel_gap": 0.0, "presolve": True, "time_limit": MILP_TIME_LIMIT_S})
    if result.x is None:
        return None
    chosen = np.zeros(groups, dtype=np.int64)
    picked = result.x > 0.5
    chosen[group_of[picked]] = option_of[picked]
    return chosen
