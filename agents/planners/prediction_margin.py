"""The prediction margin: the share of the budget that plans of predicted steps are made at.

A plan of a step the step model predicts (:class:`~kdvfs.envs.model.step_model.StepModel`) is priced on the
prediction; run on the real step it spends what the prediction missed on top of its budget. The margin is set
from the captured references alone, the way they would meet a shape they do not hold: each reference that the
model of the others covers is predicted from them, planned at the budget by the latency-aware optimum
(:class:`~kdvfs.agents.planners.latency_optimal.LatencyOptimal`) and executed on its own kernels, each at the
action of the predicted kernel standing for it (:func:`~kdvfs.envs.model.step.align.slots`), with the switching
latency; the margin is the budget over the largest slowdown among them, at most 1. It is 1 where no reference
overruns, or none can be predicted from the others (fewer than three references, or each outside the others'
coverage): no evidence, no margin. A fraction; plans of predicted steps are made at ``budget * margin``. Never
reads a step it will be used on.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import current_process, get_context

from kdvfs.agents.common.problem import Problem, score
from kdvfs.agents.planners.latency_optimal import LatencyOptimal
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.schedule import Schedule
from kdvfs.envs.model.step.align import slots
from kdvfs.envs.model.step_model import AlignedSteps, StepModel, StepModelError
from kdvfs.envs.trace.trace import Trace

MIN_REFERENCES = 3
"""Fewest references for a margin: each one held out leaves two to fit the model of the others."""


@dataclass(frozen=True)
class PredictionMargin:
    """The margin (a fraction of the budget, in (0, 1]) and the slowdown (%) of each reference it was set from,
    planned on its prediction from the others (``slowdowns_pct``: empty where none could be predicted)."""

    margin: float
    slowdowns_pct: tuple[float, ...]

    def as_json(self) -> dict[str, object]:
        return {"margin": self.margin, "slowdowns_pct": list(self.slowdowns_pct)}


def held_out_slowdown_pct(predicted: Trace, reference: Trace, profile: GpuProfile, budget: float,
                          latency_s: float | None) -> float:
    """The slowdown (%) of ``reference`` run at the latency-aware optimum of ``predicted`` (its prediction from the
    other references) at ``budget``, each kernel at the action of its predicted stand-in."""
    planner = LatencyOptimal()
    planned = planner.plan(Problem.build(predicted, profile, budget, latency_s)).actions
    executed = Problem.build(reference, profile, budget, latency_s)
    return score(executed, Schedule(planned[slots(predicted, reference)], planner.name)).slowdown_pct


_CONTEXT: list[tuple[AlignedSteps, GpuProfile, float, float | None]] = []
"""What the forked workers of :func:`prediction_margin` read (set before they fork; nothing large is pickled)."""


def _held_out_slowdown_pct(index: int) -> float | None:
    """Reference ``index``'s slowdown (%) planned on its prediction from the others; None where they fit no model
    or do not cover its shape."""
    steps, profile, budget, latency_s = _CONTEXT[0]
    reference = steps.traces[index]
    try:
        model = StepModel.of_aligned(steps.without(index))
    except StepModelError:  # the others fit no model: this reference says nothing
        return None
    shape = reference.meta.step_shape
    assert shape is not None
    if not model.covers(shape):
        return None
    return held_out_slowdown_pct(model.predict(shape), reference, profile, budget, latency_s)


def prediction_margin(references: AlignedSteps, profile: GpuProfile, budget: float, latency_s: float | None,
                      workers: int | None = None) -> PredictionMargin:
    """The margin of the plans of steps predicted from ``references`` (module docstring; aligned once, as the
    step model of them is: :meth:`StepModel.of_aligned`) at ``budget`` (a fraction) and ``latency_s`` (None: the
    profile's); each reference in a forked worker process, ``workers`` of them (default: one per CPU; 1: in this
    process)."""
    count = len(references.traces)
    if count < MIN_REFERENCES:
        return PredictionMargin(1.0, ())
    _CONTEXT[:] = [(references, profile, budget, latency_s)]
    try:
        indices = range(count)
        processes = min(count, workers or os.cpu_count() or 1)
        if processes == 1 or current_process().daemon:  # a daemonic process may not start workers
            found = [_held_out_slowdown_pct(index) for index in indices]
        else:
            with ProcessPoolExecutor(processes, get_context("fork")) as pool:
                found = list(pool.map(_held_out_slowdown_pct, indices))
    finally:
        _CONTEXT.clear()
    slowdowns = [slowdown for slowdown in found if slowdown is not None]
    worst_pct = max(slowdowns, default=0.0)
    margin = min(1.0, 100.0 * budget / worst_pct) if worst_pct > 0 else 1.0
    return PredictionMargin(margin, tuple(slowdowns))
