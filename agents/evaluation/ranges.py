"""Each schedule's energy saved and slowdown against auto with its two-sided range (:mod:`kdvfs.envs.model.ranges`).

The parameters' part: the nominal schedule is priced on every sampled profile (:mod:`kdvfs.envs.model.uncertainty`)
against that profile's own auto, with no re-planning, so a range says how the plan a user gets fares on a GPU
whose parameters are others within their ranges. The validated part: the clocks evidence of the profile
(:func:`kdvfs.envs.model.model_error.range_basis`), weighted by the share of the step the schedule moves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kdvfs.agents.common.problem import Problem, outcome_of
from kdvfs.agents.evaluation.compare import Row
from kdvfs.envs.model.model_error import RangeBasis, range_basis
from kdvfs.envs.model.ranges import change_ranges, changed_shares, log_deviations, range_json
from kdvfs.envs.model.schedule import Schedule
from kdvfs.envs.model.uncertainty import UncertaintySpec, sampled_profiles


@dataclass(frozen=True)
class ChangeRange:
    """A schedule's energy saved and slowdown ranges (percent, ``[low, high]``), with how they were found."""

    energy_saved_pct: list[float]
    slowdown_pct: list[float]
    basis: RangeBasis
    samples: int
    seed: int

    def as_json(self) -> dict[str, Any]:
        """The ``range`` object of a row (:func:`kdvfs.envs.model.ranges.range_json`)."""
        return range_json({"energy_saved_pct": self.energy_saved_pct, "slowdown_pct": self.slowdown_pct},
                          self.basis, self.samples, self.seed)


def latency_fixed(problem: Problem) -> bool:
    """Whether ``problem``'s switching latency was set apart from its profile's (then it is not varied)."""
    return problem.latency_s != problem.profile.switching.latency_mean_s


def sampled_problems(problem: Problem, spec: UncertaintySpec | None,
                     progress: Callable[[int, int], None] | None = None) -> list[Problem]:
    """``problem`` on each sampled profile of ``spec`` (none for None): its trace with features, budget and
    power limit; its latency unless :func:`latency_fixed` (else each sample's), reporting ``(done, total)``."""
    if spec is None:
        return []
    fixed = latency_fixed(problem)
    profiles = sampled_profiles(problem.profile, UncertaintySpec(spec.samples, spec.seed, spec.vary_latency
                                                                 and not fixed))
    problems = []
    for done, profile in enumerate(profiles, start=1):
        problems.append(Problem.build(problem.trace, profile, problem.budget, problem.latency_s if fixed else None,
                                      problem.power_limit_w))
        if progress:
            progress(done, len(profiles))
    return problems


def _ratios(problem: Problem, schedule: Schedule) -> tuple[float, float]:
    executed, auto = outcome_of(problem, schedule), problem.auto
    return executed.energy_j / auto.energy_j, executed.time_s / auto.time_s


def schedule_range(problem: Problem, schedule: Schedule, samples: Sequence[Problem], seed: int = 0,
                   basis: RangeBasis | None = None) -> ChangeRange:
    """The range of ``schedule``'s saving and slowdown on ``problem``, priced on each of ``samples`` too."""
    basis = range_basis(problem.profile) if basis is None else basis
    energy, time = _ratios(problem, schedule)
    sampled = [_ratios(sample, schedule) for sample in samples]
    shares = changed_shares(problem.costs, outcome_of(problem, schedule).applied)
    saved, slowdown = change_ranges(energy, time, shares, basis, log_deviations(energy, [s[0] for s in sampled]),
                                    log_deviations(time, [s[1] for s in sampled]))
    return ChangeRange(saved, slowdown, basis, len(samples), seed)


def _limit_ratios(problem: Problem, limit_w: float) -> tuple[float, float]:
    """Energy and time of auto under ``limit_w`` over auto under ``problem``'s limit."""
    capped = Problem.build(problem.trace, problem.profile, problem.budget, problem.latency_s, limit_w).auto
    auto = problem.auto
    return capped.energy_j / auto.energy_j, capped.time_s / auto.time_s


def limit_range(problem: Problem, limit_w: float, samples: Sequence[Problem], seed: int = 0,
                basis: RangeBasis | None = None) -> ChangeRange:
    """The range of running auto under the board power limit ``limit_w`` (W) instead of ``problem``'s: every
    kernel may move, so the clocks evidence enters in full unless the limit is the same."""
    basis = range_basis(problem.profile) if basis is None else basis
    energy, time = _limit_ratios(problem, limit_w)
    sampled = [_limit_ratios(sample, limit_w) for sample in samples]
    moved = 0.0 if limit_w == problem.power_limits.priced_w else 1.0
    saved, slowdown = change_ranges(energy, time, (moved, moved), basis,
                                    log_deviations(energy, [s[0] for s in sampled]),
                                    log_deviations(time, [s[1] for s in sampled]))
    return ChangeRange(saved, slowdown, basis, len(samples), seed)


def row_ranges(problem: Problem, rows: Sequence[Row], spec: UncertaintySpec | None,
               progress: Callable[[int, int], None] | None = None) -> list[ChangeRange | None]:
    """Each row's range (None for a row with neither a schedule nor a power limit), every sampled profile of
    ``spec`` (None: the validated error alone) built once and shared by the rows."""
    samples = sampled_problems(problem, spec, progress)
    basis, seed = range_basis(problem.profile), 0 if spec is None else spec.seed
    limits: dict[float | None, ChangeRange] = {
        row.power_limit_w: limit_range(problem, row.power_limit_w, samples, seed, basis)
        for row in rows if row.schedule is None and row.power_limit_w is not None}
    return [schedule_range(problem.with_budget(row.budget), row.schedule, samples, seed, basis)
            if row.schedule is not None else limits.get(row.power_limit_w) for row in rows]


DEFAULT_SPEC = UncertaintySpec()


def predicted_range(problem: Problem, schedule: Schedule, spec: UncertaintySpec | None = DEFAULT_SPEC
                    ) -> ChangeRange:
    """The range of one schedule's predicted saving and slowdown with the default sample (what ``kdvfs run``'s
    summary reports under ``predicted``, as ``kdvfs compare`` would for the same schedule)."""
    return schedule_range(problem, schedule, sampled_problems(problem, spec), 0 if spec is None else spec.seed)
