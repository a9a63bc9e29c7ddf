"""Every method's energy saved and slowdown with their ranges over the profile's parameter ranges.

Each sampled profile (:mod:`kdvfs.envs.model.uncertainty`) is a GPU whose parameters might be the true
ones: the step is priced on it and every method plans anew, so a range says what the figure could be,
not how one fixed plan fares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.evaluation.compare import Row, compare
from kdvfs.agents.planners.registry import COMPARED
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.uncertainty import METHOD, UncertaintySpec, over_samples, spread
from kdvfs.envs.trace.trace import Trace


@dataclass(frozen=True)
class RowRange:
    """A method's figures at one budget over the nominal and sampled profiles (percent, [low, high])."""

    energy_saved_pct: list[float]
    slowdown_pct: list[float]
    samples: int
    seed: int

    def as_json(self) -> dict[str, object]:
        """The ranges, the sampling method, how many sampled profiles had a schedule, and the seed."""
        return {"energy_saved_pct": self.energy_saved_pct, "slowdown_pct": self.slowdown_pct,
                "method": METHOD, "samples": self.samples, "seed": self.seed}


def _key(row: Row) -> tuple[str, float]:
    return row.executed.method, row.budget


def compare_ranges(trace: Trace, profile: GpuProfile, nominal: Sequence[Row], budgets: Sequence[float],
                   latency_s: float | None, spec: UncertaintySpec, methods: Sequence[str] = COMPARED,
                   progress: Callable[[int, int], None] | None = None, power_limit_w: float | None = None
                   ) -> dict[tuple[str, float], RowRange]:
    """The range of each nominal row's figures; ``latency_s`` fixed (not None) keeps the latency unvaried;
    every sampled profile priced at ``power_limit_w`` (W; None: the limit the trace was recorded under)."""
    figures: dict[tuple[str, float], list[Row]] = {_key(row): [row] for row in nominal}
    for sample in over_samples(profile, spec, progress):
        problem = Problem.build(trace, sample, budgets[0], latency_s, power_limit_w)
        for row in compare(problem, budgets, methods):
            figures.setdefault(_key(row), []).append(row)
    return {key: RowRange(spread(r.executed.energy_saved_pct for r in rows),
                          spread(r.executed.slowdown_pct for r in rows), len(rows) - 1, spec.seed)
            for key, rows in figures.items() if key in {_key(row) for row in nominal}}


def range_of(ranges: dict[tuple[str, float], RowRange], row: Row) -> RowRange | None:
    """The range of one nominal row, if it was computed."""
    return ranges.get(_key(row))
