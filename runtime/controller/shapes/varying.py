"""A run whose steps vary, in the training process: the captured shapes, the step model, and each step's shape.

:func:`varying_steps` decides, when the controller opens, whether the run's steps vary: they do when the
capture it was given (the trace and its ``.shape-K`` siblings, :func:`kdvfs.envs.trace.trace_set.load_trace_set`)
holds more than one step shape, in its traces or in the run's shape distribution. Then it fits the step model
on the captured traces (:class:`kdvfs.envs.model.step_model.StepModel`) and returns the
:class:`~kdvfs.runtime.controller.shapes.steps.VaryingSteps` the controller plans every bucket with,
whose shapes come from :class:`StepShapes`: a :class:`~kdvfs.runtime.step_shapes.ShapeProbe` on the model,
which the controller's thread waits on for the shape of the step it decides.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path

from kdvfs.envs.model.step_model import AlignedSteps, StepModel, StepModelError
from kdvfs.envs.trace.shape import StepShape
from kdvfs.envs.trace.trace import Trace
from kdvfs.envs.trace.trace_set import load_trace_set
from kdvfs.runtime.controller.shapes.steps import VaryingSteps
from kdvfs.runtime.device.host_time import Clock
from kdvfs.runtime.step_shapes import ShapeProbe

PARTIAL_WAIT_S = 60.0
"""Longest wait for the rest of a step whose first micro-batch has started (s): the step is running, so it ends."""


class StepShapes:
    """Each step's shape as the training thread starts it, for the controller's thread to wait on.

    The probe's ``on_shape`` (on the training thread, once per forward call: a lock and a notify) wakes a
    thread waiting in :meth:`shape_of`. A step's shape is complete once it holds ``inputs`` inputs (the captured
    steps': every micro-batch of a step with gradient accumulation), or once the step ended. Step numbers are
    the controller's: :meth:`mark_step` at each of its steps.
    """

    def __init__(self, clock: Clock, inputs: int = 0) -> None:
        self.clock, self.inputs = clock, inputs
        self._arrived = threading.Condition()
        self.probe = ShapeProbe(on_shape=self._on_shape)

    def _on_shape(self, step: int, shape: StepShape) -> None:
        with self._arrived:
            self._arrived.notify_all()

    def mark_step(self) -> None:
        """The training thread ended a step (wakes a wait for a step's remaining micro-batches)."""
        with self._arrived:
            self.probe.mark_step()
            self._arrived.notify_all()

    def new_inputs(self, step: int) -> tuple[int, ...] | None:
        """For each input position, step ``step``'s forward calls with a shape new there (the probe's; None:
        unknown)."""
        return self.probe.new_inputs(step)

    def shape_and_new_inputs(self, step: int, deadline_s: float) -> tuple[StepShape | None, tuple[int, ...] | None]:
        """:meth:`shape_of` and then :meth:`new_inputs` (one answer to a controller in its own process)."""
        return self.shape_of(step, deadline_s), self.new_inputs(step)

    def shape_of(self, step: int, deadline_s: float) -> StepShape | None:
        """Step ``step``'s complete shape, waiting for its first forward call until host time ``deadline_s`` (None:
        none by then) and then for its other micro-batches until it ends (at most ``PARTIAL_WAIT_S`` more; a step
        that ended with fewer inputs gives what it had)."""
        with self._arrived:
            while (shape := self.probe.shape_of(step)) is None:
                remaining_s = deadline_s - self.clock.now_s()
                if remaining_s <= 0:
                    return None
                self._arrived.wait(remaining_s)
            give_up_s = self.clock.now_s() + PARTIAL_WAIT_S
            while len(shape.inputs) < self.inputs and self.probe.steps_marked <= step:
                remaining_s = give_up_s - self.clock.now_s()
                if remaining_s <= 0:
                    break
                self._arrived.wait(remaining_s)
                shape = self.probe.shape_of(step) or shape
            return shape


def captured_shapes(traces: list[Trace]) -> list[StepShape]:
    """The distinct shapes of a capture: its traces' and its run's distribution's, sorted."""
    shapes = {trace.meta.step_shape for trace in traces if trace.meta.step_shape is not None}
    for trace in traces:
        shapes.update(shape for shape, _ in trace.meta.shape_distribution)
    return sorted(shapes)


def varying_steps(trace_path: str, clock: Clock) -> tuple[VaryingSteps, StepShapes] | None:
    """The run's varying steps and where their shapes come from, or None when the capture at ``trace_path`` has
    one shape (the controller then replays its one step, as before; so it does, with a note on stderr, when no
    step model fits the captured traces). A step model on a smaller basis than the quadratic one says so on stderr
    (:attr:`~kdvfs.envs.model.step_model.StepModel.basis_note`). A bundled trace name has no siblings."""
    if not Path(trace_path).is_file():
        return None
    traces = load_trace_set(trace_path)
    shapes = captured_shapes(traces)
    if len(shapes) < 2:
        return None
    try:
        aligned = AlignedSteps.of([trace for trace in traces if trace.meta.step_shape is not None])
        model = StepModel.of_aligned(aligned)
    except StepModelError as error:
        print(f"kdvfs: the capture's steps vary, but no step model fits its traces ({error}); only steps like "
              f"{trace_path} are controlled", file=sys.stderr)
        return None
    if model.basis_note is not None:
        print(f"kdvfs: step model: {model.basis_note}", file=sys.stderr)
    inputs = Counter(len(t.meta.step_shape.inputs) for t in traces if t.meta.step_shape is not None)
    source = StepShapes(clock, inputs.most_common(1)[0][0] if inputs else 0)

    def predict(shape: StepShape) -> Trace | None:
        return model.predict(shape) if model.covers(shape) else None

    def progress(done: int, total: int) -> None:
        if done == total:
            print(f"kdvfs: planned {total} step-shape buckets", file=sys.stderr)

    return VaryingSteps(shapes, predict, source.shape_of, source.new_inputs, progress=progress,
                        kernel_time_s=model.kernel_time_s, step_model_basis=model.terms.value,
                        references=aligned), source
