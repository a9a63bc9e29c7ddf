"""Which expected step each training step is: one entry per shape bucket, picked when the step starts.

A run of one shape has one :class:`StepEntry` (the captured step's plan, anchors and source). A run whose steps
vary has one per bucket and margin of the :class:`~kdvfs.runtime.controller.shapes.book.ShapeBook` and a
:class:`ShapeSteps` that maps each step to its entry: the step's shape (``shape_of``, waited for until a
deadline), its bucket, the entry at the run's margin; a bucket not yet planned stands in the smallest planned
one at least as long (``stood_in``); no shape or no plan: no entry, the step runs at auto (``misses``).
:meth:`ShapeSteps.feedback` moves the margin after each A/B pair; a step counts for its bucket's expected
kernel time over the captured step's (:meth:`ShapeSteps.weight`, s over s) and has two covariates for the
A/B estimate (:meth:`ShapeSteps.covariates`).

Invariants: each entry's anchors learn only from the steps that ran it; a step's duration does not gate
control (its shape is its identity). Why: docs/design/controller.md.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kdvfs.agents.common.problem import Planner, Problem
from kdvfs.agents.planners.prediction_margin import PredictionMargin, prediction_margin
from kdvfs.envs.model.step_model import AlignedSteps
from kdvfs.envs.trace.shape import StepShape
from kdvfs.runtime.controller.decisions.sources import StepSource
from kdvfs.runtime.controller.measurement.estimator import Interval
from kdvfs.runtime.controller.model.run_summary import ShapeFigures
from kdvfs.runtime.controller.model.step_plan import StepPlan
from kdvfs.runtime.controller.shapes.book import MARGINS, Predict, ShapeBook
from kdvfs.runtime.controller.timing.anchors import Anchors

ShapeOf = Callable[[int, float], StepShape | None]
"""``shape_of(step, deadline_s)``: step ``step``'s shape, waiting until host time ``deadline_s`` at most."""
NewInputs = Callable[[int], tuple[int, ...] | None]
"""``new_inputs(step)``, read after ``shape_of(step, ...)``: for each input position, step ``step``'s forward calls
whose input there had a shape new to the process (:meth:`~kdvfs.runtime.step_shapes.ShapeProbe.new_inputs`; None:
unknown)."""


@dataclass(frozen=True)
class VaryingSteps:
    """What the controller needs for a run whose steps vary.

    Attributes:
        shapes: the shapes the capture saw (its captured steps' and its run's distribution).
        predict: the expected trace of a shape (the step model's), None where it does not cover it.
        shape_of: where each step's shape comes from (see :data:`ShapeOf`).
        new_inputs: where it comes from which of the step's inputs were new to the process (:data:`NewInputs`;
            None: a step counts one new input when its whole shape is new).
        progress: ``(done, total)`` after each bucket's solve (None: quiet).
        kernel_time_s: the expected kernel time at auto of any shape (s; the step model's, cheap); None: each
            step counts for its bucket's.
        step_model_basis: the basis the step model's fits are on (:class:`~kdvfs.envs.model.step.shape_fit.Terms`'
            value); None: ``predict`` is not a step model's.
        references: the captured traces the step model was fitted on, aligned, for the prediction margin
            (:mod:`kdvfs.agents.planners.prediction_margin`; None: no margin).
    """

    shapes: Sequence[StepShape]
    predict: Predict
    shape_of: ShapeOf
    new_inputs: NewInputs | None = None
    progress: Callable[[int, int], None] | None = None
    kernel_time_s: Callable[[StepShape], float] | None = None
    step_model_basis: str | None = None
    references: AlignedSteps | None = None

    def plan(self, problem: Problem, planner: Planner) -> ShapeBook:
        """The book of the buckets planned by ``planner``, at ``problem``'s GPU, budget times the references'
        prediction margin and switching latency (its worker processes stay for the buckets planned later:
        :meth:`ShapeBook.close` them)."""
        margin = (PredictionMargin(1.0, ()) if self.references is None else
                  prediction_margin(self.references, problem.profile, problem.budget, problem.latency_s))
        if margin.margin < 1.0:
            print(f"kdvfs: every shape bucket is planned at {margin.margin:.0%} of the budget (the prediction margin): "
                  f"the captured steps, each predicted from the others, ran up to {max(margin.slowdowns_pct):.2f}% "
                  "slower at their plans", file=sys.stderr)
        return ShapeBook.build(self.shapes, self.predict, problem.profile, problem.budget, problem.latency_s,
                               planner, progress=self.progress, prediction_margin=margin.margin)


@dataclass(frozen=True)
class StepEntry:
    """What the controller expects of a step and runs through it: the plan on its expected timeline, the anchors
    its requests are placed on, the source that issues them, and its bucket's label (``""`` for a run of one
    shape) and its expected kernel time."""

    plan: StepPlan
    anchors: Anchors
    source: StepSource
    key: str = ""
    kernel_s: float = 0.0
    """The step's expected kernel time at auto (s; 0 for a run of one shape, which does not weight steps)."""
    online: bool = False
    """Its source is a frozen policy deciding online (else a schedule replayed)."""


class ShapeSteps:
    """The entry of each step of a run whose steps vary (docs/design/controller.md).

    Args:
        book: the plans of the run's buckets.
        entries: the entries of each bucket, keyed like ``book.plans``, one per margin in the book's order.
        shape_of: the step's shape, waiting until a deadline.
        reference_kernel_s: the kernel time at auto that weights 1 (s): the captured step's.
        budget: the run's budget (fraction), which the feedback compares the measured slowdown with.
        kernel_time_s, step_model_basis, new_inputs: as :class:`VaryingSteps`'.
    """

    def __init__(self, book: ShapeBook, entries: dict[StepShape, tuple[StepEntry, ...]], shape_of: ShapeOf,
                 reference_kernel_s: float, budget: float,
                 kernel_time_s: Callable[[StepShape], float] | None = None,
                 step_model_basis: str | None = None, new_inputs: NewInputs | None = None) -> None:
        self.book, self.entries, self.shape_of, self.new_inputs = book, entries, shape_of, new_inputs
        self.reference_kernel_s, self.budget = reference_kernel_s, budget
        self.kernel_time_s, self.step_model_basis = kernel_time_s, step_model_basis
        self.margin = 0
        """The index of the margin the run plans at now."""
        self.margin_changes = 0
        self.misses: Counter[str] = Counter()
        self.steps: Counter[str] = Counter()
        self.replayed: Counter[str] = Counter()
        self.stood_in = 0
        self.last_miss = ""
        """Why the last step without an entry had none (``no_shape``, ``no_plan``)."""
        self._seen: set[StepShape] = set()
        self._covariates: dict[int, tuple[float, tuple[float, ...]]] = {}

    def add(self, top: StepShape, entries: tuple[StepEntry, ...]) -> None:
        """Bucket ``top``'s entries, planned in the background: its next steps run them."""
        self.entries[top] = entries

    def entry(self, step: int, deadline_s: float) -> StepEntry | None:
        """Step ``step``'s entry, None when it has none (docs/design/controller.md)."""
        shape = self.shape_of(step, deadline_s)
        if shape is None:
            self._miss("no_shape")
            return None
        top = self.book.bucket(shape)
        entries = self.entries.get(top)
        margin = self.margin
        if entries is None:
            self.book.request(top)
            stand_in = self.book.stand_in(top, list(self.entries))
            if stand_in is None:
                self._miss("no_plan")
                return None
            entries, margin = self.entries[stand_in], len(self.book.margins) - 1
            self.stood_in += 1
        self.steps[entries[0].key] += 1
        kernel_s = entries[0].kernel_s if self.kernel_time_s is None else self.kernel_time_s(shape)
        new = self.new_inputs(step) if self.new_inputs is not None else None
        self._covariates[step] = (kernel_s / self.reference_kernel_s,
                                  (float(shape not in self._seen),) if new is None else tuple(map(float, new)))
        self._seen.add(shape)
        return entries[margin]

    def controlled(self, entry: StepEntry) -> None:
        """A controlled step ran ``entry`` (counted by bucket where it replayed a schedule)."""
        if not entry.online:
            self.replayed[entry.key] += 1

    def _miss(self, reason: str) -> None:
        self.misses[reason] += 1
        self.last_miss = reason

    def covariates(self, step: int) -> tuple[float, tuple[float, ...]] | None:
        """Step ``step``'s expected kernel time in reference steps and its inputs of a shape new to the process
        (``new_inputs``'s counts by position; without it, one position: 1.0 when its whole shape was new, else
        0.0); None for a step without an entry. Each step's are read once (then forgotten)."""
        return self._covariates.pop(step, None)

    def feedback(self, measured: Interval | None) -> None:
        """A new A/B pair: the run's measured slowdown (%) is now ``measured`` (docs/design/controller.md)."""
        if measured is None:
            return
        margin = self.margin
        if measured.mean > self.budget and measured.lo > 0:
            margin = min(margin + 1, len(self.book.margins) - 1)
        elif measured.hi < self.budget:
            margin = max(margin - 1, 0)
        self.margin_changes += margin != self.margin
        self.margin = margin

    def weight(self, entry: StepEntry) -> float:
        """How many reference steps a step of ``entry`` counts for: its expected kernel time over the reference's."""
        return entry.kernel_s / self.reference_kernel_s

    def figures(self) -> ShapeFigures:
        """For the summary: the buckets planned, the steps that ran in each, the controlled ones that replayed a
        schedule, and those without an entry by reason (``no_shape``: not known in time; ``no_plan``: a bucket
        without a plan)."""
        return ShapeFigures(
            buckets=len(self.entries), quantum_tokens=self.book.quantum, quanta=list(self.book.quanta),
            margins=list(self.book.margins), margin=self.book.margins[self.margin], margin_changes=self.margin_changes,
            prediction_margin=self.book.margins[0] / MARGINS[0],
            planned_in_background=self.book.planned_later, plan_error=self.book.plan_error, stood_in=self.stood_in,
            steps_by_bucket=dict(sorted(self.steps.items())),
            replayed_steps_by_bucket=dict(sorted(self.replayed.items())), misses=dict(self.misses),
            step_model_basis=self.step_model_basis)
