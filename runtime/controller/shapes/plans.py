"""Plans for steps whose shape varies: one schedule per shape bucket, solved before training starts.

A run whose steps change shape (dynamic padding, bucketing, MoE routing) cannot replay one captured step's
plan: a plan transferred to another shape overruns its budget. The controller therefore keys every step by
its :class:`~kdvfs.envs.trace.shape.StepShape` (read when the step starts) and looks up a :class:`ShapePlan`
for it in a :class:`ShapeBook`:

* **Buckets.** Shapes are grouped by batch and by sequence length rounded up to ``quantum`` tokens
  (:meth:`ShapeBook.bucket`); a bucket's plan is made for its top shape, the longest step it holds, so
  that a shorter step of the bucket runs the plan of a step at least as long (stretched to the step's
  measured pace like any plan).
* **What a bucket's step is.** ``predict(shape)`` (the step model fitted on the captured shapes,
  :mod:`kdvfs.envs.model.step_model`) gives the expected trace of the bucket's top shape, or None for a shape
  it does not cover (far outside the captured range): such a bucket has no plan and its steps run at auto.
* **Margins.** Each bucket is planned at the run's budget and at fractions of it (``MARGINS``): the live
  budget feedback (:meth:`~kdvfs.runtime.controller.shapes.steps.ShapeSteps.feedback`) moves the
  run to a smaller margin when the measured slowdown exceeds the budget, where a prediction was off.
* **When plans are solved.** All of them before the first step, for every bucket the capture saw or that
  lies within the captured range (:meth:`ShapeBook.build`, on a pool of forked processes: a solve takes
  seconds, and nothing may stall a training step). A step whose bucket has no plan runs at auto and is logged.

The book's plans are one planner's at the run's budget and switching latency: the latency-optimal one for a
plan file, the policy's noise-free rollout for a policy (replayed per bucket), each priced by the one cost
model.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context

from kdvfs.agents.common.problem import Planner, Problem
from kdvfs.agents.planners.registry import make_planner
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.schedule import Schedule
from kdvfs.envs.trace.shape import StepShape
from kdvfs.envs.trace.trace import Trace

MAX_BUCKETS = 24
"""Most buckets per batch size: the quantum grows until the captured range fits."""
MIN_QUANTUM = 16
"""Smallest sequence quantum (tokens)."""
MARGINS = (1.0, 0.5)
"""The budgets each bucket is planned at, as fractions of the run's budget, largest first."""

Predict = Callable[[StepShape], Trace | None]


@dataclass(frozen=True)
class ShapePlan:
    """One bucket's plan at one margin: the expected step of its top shape, its problem and schedule.

    Attributes:
        shape: the bucket's top shape (the step the plan was made for).
        problem: that step on the GPU, with the margin's budget and the run's switching latency.
        schedule: the planner's schedule for it (one action per kernel).
        margin: the index of its margin in ``MARGINS``.
    """

    shape: StepShape
    problem: Problem
    schedule: Schedule
    margin: int = 0


_JOBS: list[tuple[Problem, Planner]] = []
"""The solves of the book being built, read by the forked workers (problems do not pickle)."""


def _solve(job: int) -> Schedule:
    problem, planner = _JOBS[job]
    return planner.plan(problem)


def kernel_time_s(problem: Problem) -> float:
    """The step's kernel time at auto (s): its kernels' durations, no idle gaps."""
    costs = problem.costs
    return float(costs.time_s[:, costs.auto_index].sum())


def seq_quantum(seqs: Iterable[int]) -> int:
    """The sequence quantum (tokens): at least ``MIN_QUANTUM``, a power of two, and large enough that the
    range of ``seqs`` spans at most ``MAX_BUCKETS`` buckets."""
    values = sorted(set(seqs))
    if not values:
        return MIN_QUANTUM
    quantum = MIN_QUANTUM
    while math.ceil(values[-1] / quantum) - (values[0] - 1) // quantum > MAX_BUCKETS:
        quantum *= 2
    return quantum


class ShapeBook:
    """The plans of a run's step shapes (see the module docstring).

    Args:
        plans: the plans of each bucket key (:meth:`bucket`), one per margin of ``MARGINS``, in its order.
        quantum: the sequence quantum (tokens); 0: shapes are keyed exactly (images, no sequence).
    """

    margins = MARGINS

    def __init__(self, plans: dict[StepShape, tuple[ShapePlan, ...]], quantum: int) -> None:
        self.plans, self.quantum = plans, quantum

    def bucket(self, shape: StepShape) -> StepShape:
        """The top shape of ``shape``'s bucket: every input's sequence dimension (its second, where it equals
        ``shape.seq``) rounded up to the quantum; other dimensions unchanged."""
        if self.quantum <= 0 or shape.seq <= 1:
            return shape
        return _with_seq(shape, math.ceil(shape.seq / self.quantum) * self.quantum)

    def plan_for(self, shape: StepShape, margin: int = 0) -> ShapePlan | None:
        """The plan of ``shape``'s bucket at margin ``margin``, None when it has none (the step runs at auto)."""
        plans = self.plans.get(self.bucket(shape))
        return None if plans is None else plans[margin]

    @classmethod
    def build(cls, shapes: Sequence[StepShape], predict: Predict, profile: GpuProfile, budget: float,
              latency_s: float | None, planner: Planner | None = None, workers: int | None = None,
              progress: Callable[[int, int], None] | None = None) -> ShapeBook:
        """Plan the buckets of ``shapes`` and of the range between them (per batch size): predict each
        bucket's top shape and solve it with ``planner`` (default the latency-optimal one) at each margin of
        ``budget`` (a fraction) and at ``latency_s`` (None: the profile's), on ``workers`` processes (default:
        the CPUs, at most the solves); ``progress(done, total)`` after each solve."""
        quantum = seq_quantum(shape.seq for shape in shapes)
        book = cls({}, quantum if any(shape.seq > 1 for shape in shapes) else 0)
        problems: dict[StepShape, Problem] = {}  # priced once per bucket: the margins change the budget only
        for top in book._tops(shapes):
            trace = predict(top)
            if trace is not None:
                problems[top] = Problem.build(trace, profile, budget, latency_s)
        planner = planner or make_planner("latency-optimal")
        jobs = [(replace(problem, budget=budget * margin), planner) for problem in problems.values()
                for margin in MARGINS]
        if not jobs:
            return book
        _JOBS[:] = jobs
        schedules = []
        try:
            with ProcessPoolExecutor(min(workers or os.cpu_count() or 1, len(jobs)), get_context("fork")) as pool:
                for schedule in pool.map(_solve, range(len(jobs))):
                    schedules.append(schedule)
                    if progress is not None:
                        progress(len(schedules), len(jobs))
        finally:
            _JOBS.clear()
        for i, top in enumerate(problems):  # jobs and schedules: each bucket's margins in a row
            first = i * len(MARGINS)
            book.plans[top] = tuple(ShapePlan(top, jobs[first + m][0], schedules[first + m], m)
                                    for m in range(len(MARGINS)))
        return book

    def _tops(self, shapes: Sequence[StepShape]) -> list[StepShape]:
        """The top shapes of the buckets of ``shapes`` and, per batch and input layout, of every bucket between
        the shortest and the longest, sorted."""
        tops = {self.bucket(shape) for shape in shapes}
        if self.quantum > 0:
            by_layout: dict[tuple[int, ...], list[StepShape]] = {}
            for top in tops:
                by_layout.setdefault((top.batch, len(top.inputs)), []).append(top)
            for group in by_layout.values():
                low, high = min(group, key=lambda s: s.seq), max(group, key=lambda s: s.seq)
                for seq in range(low.seq, high.seq, self.quantum):
                    tops.add(self.bucket(_with_seq(low, seq)))
        return sorted(tops)


def _with_seq(shape: StepShape, seq: int) -> StepShape:
    """``shape`` with its sequence dimension (where it equals ``shape.seq``) set to ``seq``."""
    return StepShape(tuple((*dims[:1], seq, *dims[2:]) if len(dims) >= 2 and dims[1] == shape.seq else dims
                           for dims in shape.inputs))
