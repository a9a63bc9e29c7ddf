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

from collections.abc import Sequence
from dataclasses import dataclass

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


def prediction_margin(references: Sequence[Trace], profile: GpuProfile, budget: float, latency_s: float | None
                      ) -> PredictionMargin:
    """The margin of the plans of steps predicted from ``references`` (module docstring) at ``budget`` (a
    fraction) and ``latency_s`` (None: the profile's)."""
    shaped = [trace for trace in references if trace.meta.step_shape is not None]
    if len(shaped) < MIN_REFERENCES:
        return PredictionMargin(1.0, ())
    steps = AlignedSteps.of(shaped)  # each pair aligned once, not once per model of the others
    slowdowns = []
    for reference in steps.traces:
        try:
            model = StepModel.of_aligned(steps.without(steps.traces.index(reference)))
        except StepModelError:  # the others fit no model: this reference says nothing
            continue
        shape = reference.meta.step_shape
        assert shape is not None
        if model.covers(shape):
            slowdowns.append(held_out_slowdown_pct(model.predict(shape), reference, profile, budget, latency_s))
    worst_pct = max(slowdowns, default=0.0)
    margin = min(1.0, 100.0 * budget / worst_pct) if worst_pct > 0 else 1.0
    return PredictionMargin(margin, tuple(slowdowns))
