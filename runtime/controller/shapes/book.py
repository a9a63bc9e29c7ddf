"""Plans for steps whose shape varies: one schedule per shape bucket, solved before training starts.

Owns the :class:`ShapeBook`: shapes grouped into buckets by their length classes, each rounded up to its own
quantum (at most ``MAX_BUCKETS`` buckets for one class, ``MAX_GRID`` in all), each bucket planned for its top
shape (the longest step it holds) at each fraction of ``MARGINS`` of the run's budget times the prediction margin
(1: none), from the step model's expected trace (``predict``; None: no plan, its steps run at auto). Buckets the
capture saw are planned before the first step (:meth:`ShapeBook.build`); one met later in the background
(:meth:`ShapeBook.request`), until then :meth:`ShapeBook.stand_in` names the smallest planned bucket at least as
long. A bucket's online decisions are prepared on the book's thread once it is planned (:meth:`ShapeBook.
prepare_buckets`, after the buckets waiting to be planned). Times in seconds, budgets fractions.

Invariants: nothing here blocks a training step: the book's worker processes predict, price and solve a bucket,
and the training process only keeps the result; the plans are one planner's, priced by the one cost model.
Failure modes: a failed background solve or preparation ends background work (``plan_error``); the run goes
on with the plans (and preparations) it has. Why buckets and margins: docs/design/controller.md."""

from __future__ import annotations

import itertools
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

from kdvfs.agents.common.problem import Planner, Problem
from kdvfs.agents.planners.registry import make_planner
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.schedule import Schedule
from kdvfs.envs.trace.shape import ShapeAxes, StepShape
from kdvfs.envs.trace.trace import Trace

MAX_BUCKETS = 24
"""Most buckets of a single rounded length class: the quantum grows until the captured range fits."""
MIN_QUANTUM = 16
"""Smallest sequence quantum (tokens)."""
MAX_GRID = 64
"""Most buckets of a grid of several rounded length classes (each class gets an equal share of it)."""
MARGINS = (1.0, 0.5)
"""The budgets each bucket is planned at, as fractions of the run's budget, largest first."""

STOP, PLAN, PREPARE = 0, 1, 2
"""The book thread's work, in the order it takes it: stop, plan a bucket, prepare a planned one."""

STOP_TIMEOUT_S = 5.0
"""Longest wait for the background planning thread at :meth:`ShapeBook.close` (s)."""

Predict = Callable[[StepShape], Trace | None]


@dataclass(frozen=True)
class ShapePlan:
    """One bucket's plan at one margin: the expected step of its top shape, its problem and schedule.

    Attributes:
        shape: the bucket's top shape (the step the plan was made for).
        problem: that step on the GPU, with the margin's budget and the run's switching latency.
        schedule: the planner's schedule for it (one action per kernel).
        margin: the index of its margin in the book's ``margins``.
    """

    shape: StepShape
    problem: Problem
    schedule: Schedule
    margin: int = 0


_CONTEXT: list[tuple[Predict, GpuProfile, float | None, Planner]] = []
"""What the forked workers solve with (the step model's prediction and the planner do not pickle)."""


def _solve(top: StepShape, budget: float, margins: Sequence[float]) -> tuple[Problem, tuple[Schedule, ...]] | None:
    """Bucket ``top`` priced at ``budget`` and its schedule at each fraction ``margins`` of it (in a worker: the
    prediction, pricing and solves hold no lock of the training process); None where the step model does not
    cover it."""
    predict, profile, latency_s, planner = _CONTEXT[0]
    trace = predict(top)
    if trace is None:
        return None
    problem = Problem.build(trace, profile, budget, latency_s)
    return problem, tuple(planner.plan(problem.with_budget(budget * margin)) for margin in margins)


def _ready() -> None:
    """Nothing: submitted once so that the workers fork when the book is built."""


def kernel_time_s(problem: Problem) -> float:
    """The step's kernel time at auto (s): its kernels' durations, no idle gaps."""
    costs = problem.costs
    return float(costs.time_s[:, costs.auto_index].sum())


def seq_quantum(seqs: Iterable[int], buckets: int = 0) -> int:
    """The sequence quantum (tokens): at least ``MIN_QUANTUM``, a power of two, and large enough that the
    range of ``seqs`` spans at most ``buckets`` (default ``MAX_BUCKETS``) buckets."""
    values = sorted(set(seqs))
    if not values:
        return MIN_QUANTUM
    quantum = MIN_QUANTUM
    while math.ceil(values[-1] / quantum) - (values[0] - 1) // quantum > (buckets or MAX_BUCKETS):
        quantum *= 2
    return quantum


class ShapeBook:
    """The plans of a run's step shapes (docs/design/controller.md).

    Args:
        plans: the plans of each bucket key (:meth:`bucket`), one per margin of ``MARGINS``, in its order.
        axes: the length classes buckets are made of (:meth:`ShapeAxes.of` the run's shapes).
        quanta: each class's quantum (0: exact).
    """

    margins: tuple[float, ...] = MARGINS
    """The budgets each bucket is planned at, as fractions of the run's budget: ``MARGINS`` times the prediction
    margin the book was built with (:meth:`build`)."""

    def __init__(self, plans: dict[StepShape, tuple[ShapePlan, ...]], axes: ShapeAxes,
                 quanta: Sequence[int]) -> None:
        self.plans, self.axes, self.quanta = plans, axes, tuple(quanta)
        self.problems: dict[StepShape, Problem] = {}
        self._pool: ProcessPoolExecutor | None = None
        self._requests: queue.PriorityQueue[tuple[int, int, StepShape | None]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._ended = False
        self._requested: set[StepShape] = set()
        self._thread: threading.Thread | None = None
        self._budget = 0.0
        self.on_plan: Callable[[StepShape, tuple[ShapePlan, ...], float], None] | None = None
        """Called on the book's thread with each bucket planned in the background and the wall seconds its solve
        took on a worker (set before any request)."""
        self._prepare: Callable[[StepShape, tuple[ShapePlan, ...]], None] | None = None
        self.planned_later = 0
        self.plan_error: str | None = None

    @property
    def quantum(self) -> int:
        """The first rounded class's quantum (0: none), for the summary."""
        return next((q for q in self.quanta if q > 0), 0)

    def bucket(self, shape: StepShape) -> StepShape:
        """The top shape of ``shape``'s bucket: each length class rounded up to its quantum (batch sizes and
        shapes of another structure unchanged)."""
        if not self.axes.fits(shape) or not any(self.quanta):
            return shape
        values = [v if q <= 0 else math.ceil(v / q) * q for v, q in zip(self.axes.class_values(shape),
                                                                          self.quanta, strict=True)]
        return self.axes.with_classes(shape, values)

    def plan_for(self, shape: StepShape, margin: int = 0) -> ShapePlan | None:
        """The plan of ``shape``'s bucket at margin ``margin``, None when it has none (the step runs at auto)."""
        plans = self.plans.get(self.bucket(shape))
        return None if plans is None else plans[margin]

    def stand_in(self, top: StepShape, planned: Iterable[StepShape]) -> StepShape | None:
        """Of the ``planned`` bucket tops, the one whose plan a step of bucket ``top`` may run until its own is
        in: the smallest (in size) at least as long as ``top`` in every class and of equal batch sizes; None
        when none is."""
        if not self.axes.fits(top):
            return None
        want = self.axes.class_values(top)

        def holds(other: StepShape) -> bool:
            have = self.axes.class_values(other)
            return self.axes.fits(other) and all(h == w if q <= 0 else h >= w for h, w, q in
                                                 zip(have, want, self.quanta, strict=True))

        found = [other for other in planned if holds(other)]
        return min(found, key=lambda s: (self.axes.size(s), s)) if found else None

    @classmethod
    def build(cls, shapes: Sequence[StepShape], predict: Predict, profile: GpuProfile, budget: float,
              latency_s: float | None, planner: Planner | None = None, workers: int | None = None,
              progress: Callable[[int, int], None] | None = None, prediction_margin: float = 1.0) -> ShapeBook:
        """Plan the buckets of ``shapes`` (and, for one length class, of the range between them, per batch
        size): predict each bucket's top shape and solve it with ``planner`` (default the latency-optimal one)
        at each fraction of ``MARGINS`` times ``prediction_margin`` (:mod:`kdvfs.agents.planners.
        prediction_margin`) of ``budget`` (a fraction) and at ``latency_s`` (None: the profile's), on ``workers``
        processes (default: the CPUs); ``progress(done, total)`` after each bucket. The pool stays for the
        buckets planned later (:meth:`request`) until :meth:`close`."""
        axes = ShapeAxes.of(shapes)
        rounded = sum(not exact for exact in axes.exact)
        per_class = MAX_BUCKETS if rounded <= 1 else max(2, int(MAX_GRID ** (1 / rounded)))
        quanta = [0 if exact else seq_quantum((v for s in shapes if axes.fits(s)
                                               for v in [axes.class_values(s)[k]]), per_class)
                  for k, exact in enumerate(axes.exact)]
        book = cls({}, axes, quanta)
        book._budget = budget
        book.margins = tuple(prediction_margin * margin for margin in MARGINS)
        _CONTEXT[:] = [(predict, profile, latency_s, planner or make_planner("latency-optimal"))]
        book._pool = ProcessPoolExecutor(max(1, workers or os.cpu_count() or 1), get_context("fork"))
        book._pool.submit(_ready).result()
        futures = {top: book._pool.submit(_solve, top, budget, book.margins) for top in book._tops(shapes)}
        for done, (top, future) in enumerate(futures.items(), 1):
            book._add(top, future.result())
            if progress is not None:
                progress(done, len(futures))
        return book

    def _add(self, top: StepShape, solved: tuple[Problem, tuple[Schedule, ...]] | None) -> bool:
        """Keep bucket ``top``'s solve (:func:`_solve`); False for none."""
        if solved is None:
            return False
        problem, schedules = solved
        self.problems[top] = problem
        self.plans[top] = self._margins(top, schedules)
        return True

    def _margins(self, top: StepShape, schedules: Sequence[Schedule]) -> tuple[ShapePlan, ...]:
        problem = self.problems[top]
        return tuple(ShapePlan(top, problem.with_budget(self._budget * margin), schedule, m)
                     for m, (margin, schedule) in enumerate(zip(self.margins, schedules, strict=True)))

    def request(self, top: StepShape) -> None:
        """Plan bucket ``top`` in the background (once; nothing without a pool, for a planned bucket or one the
        step model does not cover); :attr:`on_plan` gets its plans."""
        if self._pool is None or top in self.plans or top in self._requested:
            return
        self._requested.add(top)
        self._put(PLAN, top)

    def prepare_buckets(self, prepare: Callable[[StepShape, tuple[ShapePlan, ...]], None]) -> None:
        """Call ``prepare(top, plans)`` on the book's thread for every bucket planned, now and later (each after
        the buckets waiting to be planned then; a failure ends background work: ``plan_error``)."""
        self._prepare = prepare
        for top in list(self.plans):
            self._put(PREPARE, top)

    def _put(self, work: int, top: StepShape | None) -> None:
        """Queue ``work`` for bucket ``top`` on the book's thread (started at the first; nothing once ended)."""
        if self._ended:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="kdvfs-bucket-plans", daemon=True)
            self._thread.start()
        self._requests.put((work, next(self._order), top))

    def _work(self) -> None:
        while True:
            work, _, top = self._requests.get()
            try:
                if top is None or not (self._plan_one(top) if work == PLAN else self._prepare_one(top)):
                    break
            finally:
                self._requests.task_done()
        self._ended = True
        while True:  # what was queued will not be done: settle() does not wait for it
            try:
                self._requests.get_nowait()
            except queue.Empty:
                return
            self._requests.task_done()

    def _prepare_one(self, top: StepShape) -> bool:
        """Prepare planned bucket ``top``; False once it failed (``plan_error``)."""
        assert self._prepare is not None
        try:
            self._prepare(top, self.plans[top])
        except Exception as error:
            self.plan_error = f"{type(error).__name__}: {error}"
            return False
        return True

    def _plan_one(self, top: StepShape) -> bool:
        """Plan bucket ``top`` on the pool (nothing for a shape the step model does not cover); False once
        planning has ended (closed, or a broken pool: the run goes on with the plans it has)."""
        pool = self._pool
        if pool is None:
            return False
        try:
            start_s = time.perf_counter()
            solved = pool.submit(_solve, top, self._budget, self.margins).result()
            solve_s = time.perf_counter() - start_s
            if not self._add(top, solved):
                return True
        except Exception as error:
            self.plan_error = f"{type(error).__name__}: {error}"
            return False
        plans = self.plans[top]
        self.planned_later += 1
        if self.on_plan is not None:
            self.on_plan(top, plans, solve_s)
        if self._prepare is not None:
            self._put(PREPARE, top)
        return True

    def settle(self) -> None:
        """Block until every bucket requested so far is planned and prepared (or background work ended): for
        tests and benchmarks, never the training thread."""
        if self._thread is not None:
            self._requests.join()

    def close(self) -> None:
        """Stop planning in the background and end the worker processes (idempotent)."""
        pool, self._pool = self._pool, None
        if self._thread is not None:
            self._put(STOP, None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
            self._thread = None

    def _tops(self, shapes: Sequence[StepShape]) -> list[StepShape]:
        """The top shapes of the buckets of ``shapes`` and, for a single rounded length class, per value of the
        other classes, of every bucket between the shortest and the longest, sorted."""
        tops = {self.bucket(shape) for shape in shapes if self.axes.fits(shape)}
        rounded = [k for k, q in enumerate(self.quanta) if q > 0]
        if len(rounded) == 1:
            k = rounded[0]
            by_rest: dict[tuple[int, ...], list[StepShape]] = {}
            for top in tops:
                values = self.axes.class_values(top)
                by_rest.setdefault(values[:k] + values[k + 1:], []).append(top)
            for group in by_rest.values():
                low = min(group, key=lambda s: self.axes.class_values(s)[k])
                lengths = list(self.axes.class_values(low))
                high = max(self.axes.class_values(s)[k] for s in group)
                for value in range(lengths[k], high, self.quanta[k]):
                    lengths[k] = value
                    tops.add(self.bucket(self.axes.with_classes(low, lengths)))
        return sorted(tops)
