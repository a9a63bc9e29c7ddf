"""A frozen policy deciding online in a run whose steps vary: one policy per shape bucket, one online path.

Each bucket gets an :class:`~kdvfs.agents.learned.policy.deciders.OnlineDecider` over its problem, prepared on the
shape book's thread once the bucket is planned (:meth:`~kdvfs.runtime.controller.shapes.book.ShapeBook.
prepare_buckets`; :func:`bucket_policy`); until then its steps run its schedule replayed, or a stand-in's, as
before. Once prepared, the bucket's entries (one per margin, on the same plans and anchors) become
:class:`BucketDecisions`: each hands the run's one
:class:`~kdvfs.runtime.controller.decisions.online.OnlineSteps` its :class:`OnlineStep` at the step's start, so
the budget feedback, the clocks in effect and the decision figures are the run's, whichever bucket a step is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.policy.deciders import OnlineDecider, online_decider
from kdvfs.runtime.controller.decisions.online import OnlineSteps
from kdvfs.runtime.controller.decisions.online_step import OnlineStep
from kdvfs.runtime.controller.measurement.estimator import Interval
from kdvfs.runtime.controller.model.run_summary import OnlineFigures
from kdvfs.runtime.controller.shapes.steps import StepEntry
from kdvfs.runtime.controller.timing.gpu_timeline import StepEnd


class BucketDecisions:
    """The step source of a bucket's entry at one margin: the run's :class:`OnlineSteps` deciding over the
    bucket's :class:`OnlineStep` (a :class:`~kdvfs.runtime.controller.decisions.sources.StepSource`)."""

    def __init__(self, steps: OnlineSteps, step: OnlineStep) -> None:
        self.steps, self.step = steps, step

    @property
    def next_request_s(self) -> float:
        return self.steps.next_request_s

    @property
    def sleeps_lead_in(self) -> bool:
        return self.steps.sleeps_lead_in

    def run(self, step: int, start_s: float, scale: float, first: bool, stop: threading.Event,
            lead_in: Callable[[], None] | None = None) -> None:
        """Take this bucket's step, then decide through step ``step`` (:meth:`OnlineSteps.run`)."""
        self.steps.take(self.step)
        self.steps.run(step, start_s, scale, first, stop, lead_in)

    def feedback(self, measured: Interval | None) -> None:
        self.steps.feedback(measured)

    def observe(self, end: StepEnd, matched: bool, controlled: bool) -> None:
        """Learn from a finished step of this entry (its own host times)."""
        self.step.observe(end, matched, controlled)

    def figures(self) -> OnlineFigures:
        return self.steps.figures()


def bucket_policy(online: OnlineDecider, problem: Problem) -> OnlineDecider:
    """The policy of ``online`` over a bucket's ``problem``, prepared (:meth:`OnlinePolicy.prepare`), with its own
    buffers (a copy of the frozen policy: this runs beside the controller's thread deciding with another)."""
    policy = online_decider(replace(online.policy), problem)
    policy.prepare()
    return policy


def online_entries(steps: OnlineSteps, online: OnlineDecider, entries: tuple[StepEntry, ...],
                   margins: tuple[float, ...]) -> tuple[StepEntry, ...]:
    """A bucket's ``entries`` (one per margin of ``margins``) deciding online with its prepared policy
    ``online``: the same plans, anchors, key and kernel time, the policy given each margin's share of the
    budget."""
    return tuple(replace(entry, source=BucketDecisions(steps, OnlineStep(online, entry.anchors, entry.plan.expected_s,
                                                                        margin, entry.key)), online=True)
                 for entry, margin in zip(entries, margins, strict=True))
