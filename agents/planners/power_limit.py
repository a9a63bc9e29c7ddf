"""The ``power-limit`` method: the lowest single board power limit that keeps the budget, clocks left to the GPU.

What a user does without kdvfs (``nvidia-smi -pl``, Zeus's power-limit optimizer, NVIDIA's workload power
profiles): lower the power limit and let the firmware pick the clocks. The step is priced in auto mode at the
highest memory clock under each candidate limit by the cost model's own power-cap logic
(:func:`~kdvfs.envs.model.cost_tables.auto_step_pricer`), its kernels as recorded under the problem's recorded
limit. Candidates are whole watts from the board's lowest settable limit up to the problem's priced limit;
a lower limit never runs the step faster (the capped clock of every window falls with the cap), so the lowest
one within the budget is found by bisection. The priced limit itself always keeps the budget (no slowdown).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from kdvfs.agents.common.problem import Problem, within_budget
from kdvfs.envs.model.cost_model import CostParams
from kdvfs.envs.model.cost_tables import auto_step_pricer

POWER_LIMIT = "power-limit"
"""The method's name in ``kdvfs compare`` and ``kdvfs evaluate``."""
LIMIT_STEP_W = 1.0
"""Resolution of the search (W): ``nvidia-smi -pl`` takes whole watts."""


@dataclass(frozen=True)
class PowerLimitChoice:
    """The chosen limit and what the step costs under it, relative to auto at the priced limit.

    Attributes:
        limit_w: the lowest limit within the budget (W).
        energy_saved_pct, slowdown_pct: against auto at the problem's priced limit (percent).
        solve_s: search time (s).
        evaluations: limits priced during the search.
    """

    limit_w: float
    energy_saved_pct: float
    slowdown_pct: float
    solve_s: float
    evaluations: int


def _lowest(candidates: list[float], keeps: Callable[[float], bool]) -> float | None:
    """The lowest of ascending ``candidates`` that ``keeps`` accepts, given that it accepts every candidate above
    an accepted one; None if it accepts none."""
    low, high, best = 0, len(candidates) - 1, None
    while low <= high:
        middle = (low + high) // 2
        if keeps(candidates[middle]):
            best, high = candidates[middle], middle - 1
        else:
            low = middle + 1
    return best


def lowest_power_limit(problem: Problem, step_w: float = LIMIT_STEP_W) -> PowerLimitChoice:
    """The lowest power limit, a multiple of ``step_w`` W within the board's range and at most the priced limit
    (or the priced limit itself), at which the step in auto mode keeps ``problem.budget``."""
    start = time.perf_counter()
    caps = problem.power_limits
    price = auto_step_pricer(problem.trace, problem.profile, CostParams.from_profile(problem.profile))
    auto_s, auto_j = price(caps.priced_w)
    figures: dict[float, tuple[float, float]] = {}

    def keeps(limit_w: float) -> bool:
        time_s, energy_j = price(limit_w)
        figures[limit_w] = (100.0 * (1.0 - energy_j / auto_j), 100.0 * (time_s / auto_s - 1.0))
        return within_budget(figures[limit_w][1], problem.budget)

    first, last = math.ceil(caps.range_w[0] / step_w), math.floor(caps.priced_w / step_w)
    candidates = [step_w * n for n in range(first, last + 1) if step_w * n < caps.priced_w]
    chosen = _lowest(candidates, keeps)
    if chosen is None:
        chosen, figures[caps.priced_w] = caps.priced_w, (0.0, 0.0)
    saved_pct, slowdown_pct = figures[chosen]
    return PowerLimitChoice(chosen, saved_pct, slowdown_pct, time.perf_counter() - start, len(figures))
