"""The step model's error, measured by leaving captured shapes out: each captured step is predicted from the
others and compared with what was measured.

Per held-out shape: the error of its kernel time (the sum of kernel durations, what clocks act on), of its
step time as the cost model prices it (kernels plus idle gaps scaled to the measured, unprofiled step time:
:func:`~kdvfs.envs.trace.trace.with_measured_gaps`), and the kernel-time-weighted duration error (the sum over
aligned kernels of |predicted - measured| duration, kernels without a partner counting whole, over the measured
kernel time). A shape outside the range of the others (its tokens, sequence length or batch beyond theirs) is an
*edge* shape: its prediction extrapolates. Each error names the basis the others determined
(:attr:`~kdvfs.envs.model.step_model.StepModel.terms`) and why it is smaller than the quadratic one, if it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kdvfs.envs.model.step.align import align, token_ids
from kdvfs.envs.model.step_model import AlignedSteps, StepModel
from kdvfs.envs.trace.shape import ShapeAxes, StepShape
from kdvfs.envs.trace.trace import Trace, with_measured_gaps


@dataclass(frozen=True)
class ShapeError:
    """The prediction error of one held-out shape (percent; signed: predicted over measured, minus 1), and the
    basis of the model of the others (``basis_terms``; ``basis_note``: why it is smaller, None on the quadratic)."""

    shape: StepShape
    edge: bool
    kernel_time_error_pct: float
    step_time_error_pct: float
    weighted_duration_error_pct: float
    basis_terms: str
    basis_note: str | None

    def as_json(self) -> dict[str, object]:
        return {"shape": self.shape.key, "edge": self.edge, "kernel_time_error_pct": self.kernel_time_error_pct,
                "step_time_error_pct": self.step_time_error_pct,
                "weighted_duration_error_pct": self.weighted_duration_error_pct, "basis_terms": self.basis_terms,
                "basis_note": self.basis_note}


def weighted_duration_error(predicted: Trace, measured: Trace) -> float:
    """Kernel-time-weighted duration error of ``predicted`` against ``measured`` (a fraction; module docstring)."""
    a, b = token_ids([predicted, measured])
    match = align(a, b)
    paired = match >= 0
    unpaired = np.ones(len(measured), dtype=bool)
    unpaired[match[paired]] = False
    error = (np.abs(predicted.duration_s[paired] - measured.duration_s[match[paired]]).sum()
             + predicted.duration_s[~paired].sum() + measured.duration_s[unpaired].sum())
    return float(error / measured.busy_s)


def is_edge(shape: StepShape, others: Sequence[StepShape]) -> bool:
    """Whether any of ``shape``'s variables, lengths or length classes (:class:`ShapeAxes` of all the shapes) lies
    outside the range of ``others``'."""
    axes = ShapeAxes.of([shape, *others])

    def where(s: StepShape) -> tuple[int, ...]:
        return (*axes.values(s), *axes.length_values(s), *axes.class_values(s))

    here, there = where(shape), [where(s) for s in others]
    return any(not min(t[i] for t in there) <= value <= max(t[i] for t in there) for i, value in enumerate(here))


def leave_one_out(traces: Sequence[Trace]) -> list[ShapeError]:
    """Each trace (one model, at least three shapes) predicted by the step model of the others, in the order of
    ``traces``; a first-seen step is measured without its one-time gaps, as the model predicts it
    (:func:`~kdvfs.envs.model.step.first_seen.warm_gaps`)."""
    errors: dict[StepShape, ShapeError] = {}
    steps = AlignedSteps.of(traces)  # each pair aligned once, not once per model of the others
    for index, held in enumerate(steps.traces):  # sorted, first-seen ones without their one-time gaps
        rest = [t for t in steps.traces if t is not held]
        shape = held.meta.step_shape
        assert shape is not None
        model = StepModel.of_aligned(steps.without(index))
        predicted = model.predict(shape)
        step_s, measured_s = with_measured_gaps(predicted).step_time_s, with_measured_gaps(held).step_time_s
        others = [t.meta.step_shape for t in rest if t.meta.step_shape is not None]
        errors[shape] = ShapeError(shape, is_edge(shape, others), 100.0 * (predicted.busy_s / held.busy_s - 1.0),
                                   100.0 * (step_s / measured_s - 1.0),
                                   100.0 * weighted_duration_error(predicted, held), model.terms.value,
                                   model.basis_note)
    return [errors[trace.meta.step_shape] for trace in traces if trace.meta.step_shape is not None]
