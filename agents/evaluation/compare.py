"""Run every decision maker on one step at one or more budgets (allowed step-time increases over auto), and
plot the trade-off.

Beside the planners, the ``power-limit`` method (:mod:`kdvfs.agents.planners.power_limit`): the lowest board
power limit within the budget with the clocks left to the GPU, what users pick without kdvfs. Every row
names the power limit its step runs under and where it comes from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

from kdvfs.agents.common.problem import InfeasibleBudgetError, Problem, Score, score
from kdvfs.agents.planners.power_limit import POWER_LIMIT, lowest_power_limit
from kdvfs.agents.planners.registry import COMPARED, make_planner
from kdvfs.common.files import write_bytes_atomic
from kdvfs.envs.model.schedule import Schedule

EVALUATED = (*COMPARED[:2], POWER_LIMIT, *COMPARED[2:])
"""What ``kdvfs compare`` and ``kdvfs evaluate`` run: every compared planner, the power-limit method after static."""
SEARCHED = "searched"
"""The power-limit source of the power-limit method's row: the limit it found."""


@dataclass(frozen=True)
class Row:
    """One method at one budget: its score when executed, and as planned (no latency, no stalls); the power limit
    its step runs under (W) and where that comes from (``trace``, ``profile default``, ``requested`` or, for the
    power-limit method, :data:`SEARCHED`), when known; the schedule scored (None for the power-limit method)."""

    budget: float
    executed: Score
    planned: Score
    power_limit_w: float | None = None
    power_limit_source: str | None = None
    schedule: Schedule | None = field(default=None, compare=False, repr=False)

    def as_json(self) -> dict[str, float | int | str]:
        limit: dict[str, float | int | str] = {} if self.power_limit_w is None or self.power_limit_source is None \
            else {"power_limit_w": self.power_limit_w, "power_limit_source": self.power_limit_source}
        return {**self.executed.as_json(), "budget_pct": 100.0 * self.budget, **limit}


def scored_row(case: Problem, schedule: Schedule) -> Row:
    """A schedule's row at ``case``'s budget, under its priced power limit."""
    caps = case.power_limits
    return Row(case.budget, score(case, schedule), score(case, schedule, ideal=True), caps.priced_w,
               caps.priced_source, schedule)


def power_limit_row(case: Problem) -> Row:
    """The power-limit method's row at ``case``'s budget: no clock changes, so executed equals planned."""
    choice = lowest_power_limit(case)
    figures = Score(POWER_LIMIT, choice.energy_saved_pct, choice.slowdown_pct, 0, choice.solve_s)
    return Row(case.budget, figures, figures, choice.limit_w, SEARCHED)


def plan_methods(case: Problem, methods: Sequence[str], progress: Callable[[str], None] | None = None
                 ) -> list[Schedule]:
    """Each method's schedule for ``case``. A method with no schedule within the budget is skipped (reported
    via ``progress``); auto and the reactive governor ignore the budget."""
    schedules = []
    for name in methods:
        if progress:
            progress(f"{name} @ {case.budget:.1%}")
        try:
            schedules.append(make_planner(name).plan(case))
        except InfeasibleBudgetError as error:
            if progress:
                progress(f"skipped: {error}")
    return schedules


def compare(problem: Problem, budgets: Sequence[float], methods: Sequence[str] = COMPARED,
            progress: Callable[[str], None] | None = None) -> list[Row]:
    """Every method at every budget, in the order of ``methods`` (planner names, or :data:`POWER_LIMIT`); a
    planner with no schedule within a budget is skipped (:func:`plan_methods`)."""
    rows = []
    for budget in budgets:
        case = problem.with_budget(budget)
        for name in methods:
            if name != POWER_LIMIT:
                rows += [scored_row(case, schedule) for schedule in plan_methods(case, [name], progress)]
                continue
            if progress:
                progress(f"{name} @ {case.budget:.1%}")
            rows.append(power_limit_row(case))
    return rows


def plot_tradeoff(rows: Sequence[Row], title: str, path: Path) -> None:
    """Energy saved against slowdown, one curve per method through its budgets in increasing order
    (executed with the problem's latency, so a plan that ignores latency can land past its budget)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.5, 5.0), dpi=120)
    for method in dict.fromkeys(row.executed.method for row in rows):
        points = [(r.executed.slowdown_pct, r.executed.energy_saved_pct)
                  for r in sorted(rows, key=lambda r: r.budget) if r.executed.method == method]
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3.5, label=method)
    axes.axhline(0.0, color="grey", linewidth=0.6)
    axes.set_xlabel("step slowdown vs auto (%)")
    axes.set_ylabel("step energy saved vs auto (%)")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="best")
    figure.tight_layout()
    buffer = BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    write_bytes_atomic(path, buffer.getvalue())
