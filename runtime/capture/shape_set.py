"""Write the traces of a capture whose steps vary: one per captured shape, the most frequent at the output path.

The traces come from :class:`kdvfs.runtime.capture.shape_rounds.ShapeRounds`' recordings; each gets its shape's own
measurements (:func:`kdvfs.runtime.capture.shape_rounds.shape_measurements`), its ``meta.step_shape`` and the window's
``meta.shape_distribution``. They are all built before any is written, so a failure writes nothing. File
names: :func:`kdvfs.envs.trace.trace_set.shape_path` (``run.trace.json``, ``run.shape-1.trace.json``, ...).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import replace
from pathlib import Path

from kdvfs.envs.model.step.validation import leave_one_out
from kdvfs.envs.trace.format import save_trace
from kdvfs.envs.trace.importing import Recording
from kdvfs.envs.trace.shape import StepShape
from kdvfs.envs.trace.trace import Trace
from kdvfs.envs.trace.trace_set import tokens_scaled
from kdvfs.runtime.capture import shape_rounds
from kdvfs.runtime.capture.capture_config import CaptureConfig
from kdvfs.runtime.capture.recording import CaptureReport, StepTiming, build_trace, read_gpu_recording, write_capture

MIN_STEP_MODEL_SHAPES = 3
"""Fewest captured shapes for the step model's leave-one-out error (two are left to fit each one)."""


def _shape_timing(timing: StepTiming, window: shape_rounds.WindowShapes, shape: StepShape) -> StepTiming:
    """The timing that scales a CPU-test-mode trace of ``shape`` to its unprofiled step time: its own mean in the
    window, else the nearest measured shape's scaled by tokens, else the window's mean."""
    measured = {s: t for s in window.counts if (t := window.step_time_s(s)) is not None}
    own_s = tokens_scaled(shape, measured) if measured else timing.step_time_s
    return replace(timing, window_s=own_s, window_steps=1)


def _build(recording: Recording, position: int, window: shape_rounds.WindowShapes, config: CaptureConfig,
           timing: StepTiming, gpu_name: str, shape: StepShape, first_seen: bool) -> Trace:
    trace = build_trace(recording, config, _shape_timing(timing, window, shape), gpu_name, step=position)
    reading = timing.reading
    measurements = shape_rounds.shape_measurements(trace, window, timing.window_s,
                                              reading.avg_power_w if reading else None, shape, first_seen)
    measurements["profiled_step_time_s"] = timing.profiled_step_time_s
    trace = replace(trace, meta=replace(trace.meta, measurements=measurements))
    return shape_rounds.with_shapes(trace, shape, window)


def _build_all(rounds: shape_rounds.ShapeRounds, window: shape_rounds.WindowShapes, config: CaptureConfig,
               timing: StepTiming, gpu_name: str, shapes: list[StepShape]) -> list[Trace]:
    """The trace of each of ``shapes``, in order. Each round's recording is read once, however many of the shapes
    it holds: reading parses the whole file (every step of the round, with a GPU's CUDA activity), the costly
    part; one recording is held at a time."""
    by_recording: dict[Path, list[StepShape]] = {}
    for shape in shapes:
        by_recording.setdefault(rounds.captured[shape][0], []).append(shape)
    built: dict[StepShape, Trace] = {}
    for path, held in by_recording.items():
        recording = read_gpu_recording(path, config)
        built.update((shape, _build(recording, rounds.captured[shape][1], window, config, timing, gpu_name, shape,
                                    shape in rounds.first_seen)) for shape in held)
    return [built[shape] for shape in shapes]


def write_shape_set(rounds: shape_rounds.ShapeRounds, window: shape_rounds.WindowShapes, config: CaptureConfig,
                    timing: StepTiming, gpu_name: str) -> CaptureReport:
    """Build every captured shape's trace, write them (the first captured target at ``config.output``, the
    others at its ``.shape-K`` paths) and return the report (the main trace's figures and ``shapes``). Says on
    stderr how long the traces and the step model's check took (seconds of the training process's time)."""
    shapes = [s for s in rounds.targets if s in rounds.captured]
    start_s = time.perf_counter()
    built = _build_all(rounds, window, config, timing, gpu_name, shapes)
    built_s = time.perf_counter()
    traces, step_model = with_step_model_errors(built)
    checked_s = time.perf_counter()
    outputs = shape_rounds.output_paths(config.output, len(traces))
    main_recording = rounds.captured[shapes[0]][0]
    for trace, output in zip(traces[1:], outputs[1:], strict=True):
        save_trace(trace, Path(output))
    report = write_capture(traces[0], main_recording, config, timing)
    recordings = len({rounds.captured[s][0] for s in shapes})
    print(f"kdvfs capture: {len(traces)} shape traces from {recordings} of {rounds.rounds} profiled rounds' "
          f"recordings in {built_s - start_s:.1f} s, the step model's leave-one-out check in "
          f"{checked_s - built_s:.1f} s, written in {time.perf_counter() - checked_s:.1f} s", file=sys.stderr)
    measurements = traces[0].meta.measurements
    report = replace(report, step_time_s=measurements.get("step_time_s", timing.step_time_s),
                     energy_j_per_step=measurements.get("energy_j_per_step"))
    summary = shape_rounds.shapes_report(window, traces, outputs, rounds.missing(), rounds.profiled_steps)
    return dataclasses.replace(report, shapes={**summary, "step_model": step_model})


def with_step_model_errors(traces: list[Trace]) -> tuple[list[Trace], list[dict[str, object]] | None]:
    """With three captured shapes or more (of one input layout): each trace with the step model's error on it when
    left out (:func:`kdvfs.envs.model.step.validation.leave_one_out`) in its measurements
    (``step_model_kernel_time_error_pct``, ``step_model_step_time_error_pct``,
    ``step_model_duration_error_pct``), and the errors for the report; else the traces unchanged and None."""
    if len(traces) < MIN_STEP_MODEL_SHAPES or len({len(t.meta.step_shape.inputs) for t in traces
                                                   if t.meta.step_shape is not None}) != 1:
        return traces, None
    errors = leave_one_out(traces)
    marked = [replace(trace, meta=replace(trace.meta, measurements={
        **trace.meta.measurements, "step_model_kernel_time_error_pct": error.kernel_time_error_pct,
        "step_model_step_time_error_pct": error.step_time_error_pct,
        "step_model_duration_error_pct": error.weighted_duration_error_pct}))
        for trace, error in zip(traces, errors, strict=True)]
    return marked, [error.as_json() for error in errors]
