"""Capture of a run whose steps vary: the window's step shapes, the shapes to profile, and the profiling rounds.

A :class:`~kdvfs.runtime.step_shapes.ShapeProbe` keys every step by the shapes of the model's forward calls.
The unprofiled window records each step's shape and time (:class:`StepClock`, seconds); with more than one
shape, :func:`choose_targets` picks up to ``shapes`` of them (the most frequent, the extremes of each
variable, then the next most frequent) and :class:`ShapeRounds` profiles rounds of :data:`ROUND_STEPS` steps
until every target was recorded or ``max_profiled_steps`` steps were profiled; a target not seen is stood in
for by the nearest profiled step (:meth:`ShapeRounds.stand_in`), else reported as missed. Each shape's trace
carries its own ``step_time_s`` (:meth:`WindowShapes.step_time_s`, non-negative fit: a longer step never gets
a shorter time), ``energy_j_per_step`` at the window's average power, the first-seen extras and the window's
measured joules (compared by :func:`kdvfs.envs.trace.trace_set.window_prediction`). The user's view:
``docs/guide/capture.md`` (Runs whose steps vary).
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from kdvfs.common.arrays import Array
from kdvfs.envs.model.step.first_seen import FIRST_SEEN_KEY, is_first_seen
from kdvfs.envs.model.step.shape_fit import basis, fit_nonnegative
from kdvfs.envs.model.step_model import COVER_FACTOR
from kdvfs.envs.trace.shape import ShapeAxes, StepShape
from kdvfs.envs.trace.trace import Trace
from kdvfs.envs.trace.trace_set import shape_path
from kdvfs.runtime.step_shapes import ShapeProbe

ROUND_STEPS = 8
"""Profiled steps per round (after its one profiler warm-up step)."""
MIN_SHAPE_STEPS = 3
"""Fewest window steps of a shape for its own step time and joules per step."""
STALL_MADS = 4.0
"""A window step slower than the warm fit by more than this many robust deviations (1.4826 x the median absolute
deviation of its residuals) is a stall, left out of the fit."""
MIN_VARYING_WINDOW_STEPS = 20
"""Fewest steps of a window that has seen more than one shape (so that its distribution means something)."""


def synchronize() -> None:
    """Wait for the GPU to finish queued work (nothing to wait for when CUDA is not in use)."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def window_axes(counts: Counter[StepShape]) -> ShapeAxes:
    """The variables of a window's shapes (those of the most frequent shape's input structure)."""
    return ShapeAxes.of(sorted(counts, key=lambda s: (-counts[s], s)))


def choose_targets(counts: Counter[StepShape], shapes: int) -> list[StepShape]:
    """Up to ``shapes`` shapes to profile: the most frequent, the smallest and largest in each variable of the
    shapes (:class:`~kdvfs.envs.trace.shape.ShapeAxes`: the tokens, or an encoder-decoder's input and label
    tokens, ...), then by frequency; among shapes seen equally often, the one farthest from those chosen (the
    largest :func:`_log_distance` to its nearest chosen shape; ties: the smaller shape). The first is the one the
    main trace keeps. Why farthest: in a run whose shapes rarely repeat (packing, dynamic padding) every shape is
    seen once, and the smallest first would put the targets (and the profiled steps standing in for them) in the
    low tail of the run's range, leaving the step model to bridge the rest."""
    by_count = sorted(counts, key=lambda s: (-counts[s], s))
    if not by_count:
        return []
    axes = window_axes(counts)
    layout = [s for s in counts if axes.fits(s)]
    extremes = []
    for k in range(len(axes.variables)):
        extremes += [min(layout, key=lambda s: (axes.values(s)[k], axes.size(s), -counts[s], s)),
                     max(layout, key=lambda s: (axes.values(s)[k], axes.size(s), counts[s], s))]
    chosen: list[StepShape] = []
    for shape in (by_count[0], *extremes):
        if shape not in chosen and len(chosen) < shapes:
            chosen.append(shape)

    def spread(shape: StepShape) -> float:  # how far ``shape`` lies from the nearest shape chosen so far
        if not axes.fits(shape):
            return 0.0
        return min((_log_distance(axes, shape, c) for c in chosen if axes.fits(c)), default=0.0)

    rest = [s for s in by_count if s not in chosen]
    while rest and len(chosen) < shapes:
        tied = [s for s in rest if counts[s] == counts[rest[0]]]
        pick = min(tied, key=lambda s: (-spread(s), s))
        chosen.append(pick)
        rest.remove(pick)
    return chosen


class StepClock:
    """The time of each step of a window: CUDA events recorded at the boundaries (no synchronisation; read
    by :meth:`durations_s` after the window's closing one) when ``cuda``, else ``now_s`` at the boundaries."""

    def __init__(self, now_s: Callable[[], float], cuda: bool) -> None:
        self._now_s, self._cuda = now_s, cuda
        self._marks: list[Any] = []

    def mark(self) -> None:
        """A step boundary (the first call opens the window)."""
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(self._now_s())

    def durations_s(self) -> list[float]:
        """Each step's time (s), in order; call after synchronising."""
        if self._cuda:
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self._marks, self._marks[1:], strict=False)]
        return [b - a for a, b in zip(self._marks, self._marks[1:], strict=False)]


@dataclass(frozen=True)
class WindowShapes:
    """The unprofiled window's steps: each one's shape (None: unknown) and time (s), and whether each ran a forward
    call of a shape new to the process (:meth:`~kdvfs.runtime.step_shapes.ShapeProbe.first_seen`; empty: not
    known, see :attr:`first_seen`)."""

    shapes: tuple[StepShape | None, ...]
    times_s: tuple[float, ...]
    new_to_process: tuple[bool, ...] = ()

    @property
    def counts(self) -> Counter[StepShape]:
        return Counter(s for s in self.shapes if s is not None)

    @property
    def varies(self) -> bool:
        return len(self.counts) > 1

    def distribution(self) -> tuple[tuple[StepShape, int], ...]:
        """``meta.shape_distribution``: the window's shapes and step counts, most frequent first."""
        counts = self.counts
        return tuple((s, counts[s]) for s in sorted(counts, key=lambda s: (-counts[s], s)))

    @property
    def first_seen(self) -> tuple[bool, ...]:
        """For each step, whether it paid a new shape's host set-up: :attr:`new_to_process` where known (a step
        whose whole shape is new may run micro-batches the process ran before, and the warm-up before the window
        ran shapes too), else whether it is its shape's first in the window."""
        if self.new_to_process:
            return self.new_to_process
        seen: set[StepShape | None] = set()
        flags = []
        for shape in self.shapes:
            flags.append(shape is not None and shape not in seen)
            seen.add(shape)
        return tuple(flags)

    def step_time_s(self, shape: StepShape) -> float | None:
        """The warm time of a step of ``shape`` (s): in a window of several shapes the fit of :attr:`warm_fit` at
        ``shape`` (a longer step never gets a shorter time), else the mean of the shape's steps (None with
        fewer than :data:`MIN_SHAPE_STEPS` of them)."""
        fit = self.warm_fit if self.varies else None
        if fit is not None:
            axes, coefficients, _ = fit
            return float(basis([shape], False, axes)[0] @ coefficients) if axes.fits(shape) else None
        times = [t for s, t in zip(self.shapes, self.times_s, strict=True) if s == shape]
        return statistics.fmean(times) if len(times) >= MIN_SHAPE_STEPS else None

    @property
    def warm_fit(self) -> tuple[ShapeAxes, Array, float] | None:
        """The window's step time as a non-negative line in its shapes' variables plus a first-seen term,
        fitted over the steps of the most frequent input structure: the variables' axes, their coefficients
        (without the first-seen term) and the first-seen step's extra seconds. None with fewer steps than
        :data:`MIN_SHAPE_STEPS` above the columns, or a single shape. In a window early in the run most shapes
        come for the first time and pay host set-up (allocations, kernel selection) while the most frequent
        repeat warm: a mean per shape would give a longer step a shorter time; the fit keeps set-up apart.
        Where fewer than :data:`MIN_SHAPE_STEPS` steps are their shape's first, or fewer are not, set-up cannot be
        told apart (one warm step would set the extra on its own): it stays in the line and the extra is 0. Steps
        slower than the fit by more than :data:`STALL_MADS` robust deviations (a stall: a kernel module loaded on
        first use, garbage collection, a checkpoint, the allocator growing) are left out and the line fitted again
        (:attr:`stall_s` their seconds beyond it). Fitted once per window: every captured shape's time and
        measurements read it."""
        fit = self._fit
        return None if fit is None else (fit[0], fit[1][:-1], float(fit[1][-1]))

    @property
    def stall_s(self) -> float:
        """The seconds the window's stalls took beyond the warm fit (:attr:`warm_fit`): one-time host events that
        no step's shape predicts (s; 0 without a fit, or where too few steps were left to fit without them)."""
        fit = self._fit
        return 0.0 if fit is None else fit[2]

    @functools.cached_property
    def _fit(self) -> tuple[ShapeAxes, Array, float] | None:
        """:attr:`warm_fit`'s axes, all its coefficients (the first-seen term last) and :attr:`stall_s`."""
        structures = Counter(len(s.inputs) for s in self.shapes if s is not None)
        if not structures:
            return None
        inputs = structures.most_common(1)[0][0]
        steps = [(s, t, first) for s, t, first in zip(self.shapes, self.times_s, self.first_seen, strict=True)
                 if s is not None and len(s.inputs) == inputs]
        axes = ShapeAxes.of([s for s, _, _ in steps])
        if not axes.classes:
            return None
        paying = sum(first for _, _, first in steps)
        separable = min(paying, len(steps) - paying) >= MIN_SHAPE_STEPS
        x = np.column_stack([basis([s for s, _, _ in steps], False, axes),
                             [float(f and separable) for _, _, f in steps]])
        if len(steps) < x.shape[1] + MIN_SHAPE_STEPS:
            return None
        y = np.array([[t] for _, t, _ in steps])
        coefficients = fit_nonnegative(x, y, np.ones_like(y))[0]
        residuals = y[:, 0] - x @ coefficients
        spread = 1.4826 * float(np.median(np.abs(residuals - np.median(residuals))))
        keep = residuals <= np.median(residuals) + STALL_MADS * spread
        if spread > 0 and not keep.all() and keep.sum() >= x.shape[1] + MIN_SHAPE_STEPS:
            coefficients = fit_nonnegative(x[keep], y[keep], np.ones_like(y[keep]))[0]
            beyond_s = y[~keep, 0] - x[~keep] @ coefficients
            return axes, coefficients, float(np.clip(beyond_s, 0.0, None).sum())
        return axes, coefficients, 0.0

    def time_cv(self) -> float | None:
        """Coefficient of variation of the step times (None below two steps)."""
        if len(self.times_s) < 2 or statistics.fmean(self.times_s) <= 0:
            return None
        return statistics.stdev(self.times_s) / statistics.fmean(self.times_s)


@dataclass
class ShapeRounds:
    """Profiling rounds until each target shape was recorded once (module docstring).

    Call :meth:`start` at a step boundary, then :meth:`step` at every later boundary with the number of the
    step that ended (:meth:`ShapeProbe.mark_step`'s) until it returns True. :attr:`captured` maps each recorded
    target to its recording and its position from the recording's end (``-1`` the last step).
    """

    targets: list[StepShape]
    probe: ShapeProbe
    folder: Path
    max_steps: int
    now_s: Callable[[], float]
    cpu_only: bool
    captured: dict[StepShape, tuple[Path, int]] = field(default_factory=dict)
    profiled: dict[StepShape, tuple[Path, int]] = field(default_factory=dict)
    """Every profiled step's shape (the recording and position of its first profiled step whose forward calls the
    process had all run before, else of its first profiled step)."""
    first_seen: set[StepShape] = field(default_factory=set)
    """The profiled shapes whose kept step ran a forward call new to the process
    (:meth:`~kdvfs.runtime.step_shapes.ShapeProbe.first_seen`): its recording holds one-time host set-up (idle
    gaps of tens of milliseconds) that the shape's later steps do not pay."""
    stood_in: dict[StepShape, StepShape] = field(default_factory=dict)
    """The profiled shape that took a missed target's place, and that target."""
    profiled_s: float = 0.0
    profiled_steps: int = 0
    rounds: int = 0
    _profiler: profile | None = None
    _warming: bool = True
    _first: int = 0
    _count: int = 0
    _mark_s: float = 0.0
    _length: int = ROUND_STEPS

    def start(self) -> None:
        """Start a round: the next step warms the profiler up."""
        self.rounds += 1
        self._length = max(1, min(ROUND_STEPS, self.max_steps - self.profiled_steps))
        path = self.folder / f"round-{self.rounds}.json"
        activities = [ProfilerActivity.CPU] + ([] if self.cpu_only else [ProfilerActivity.CUDA])
        self._profiler = profile(activities=activities, record_shapes=True,
                                 schedule=schedule(wait=0, warmup=1, active=self._length, repeat=1),
                                 on_trace_ready=lambda p: p.export_chrome_trace(str(path)))
        self._profiler.start()
        self._warming, self._count = True, 0

    def step(self, ended: int) -> bool:
        """A step boundary after step ``ended``; True once the rounds are over."""
        assert self._profiler is not None
        if self._warming:
            synchronize()
            self._profiler.step()
            self._first, self._mark_s, self._warming = ended + 1, self.now_s(), False
            return False
        self._count += 1
        if self._count < self._length:
            self._profiler.step()
            return False
        synchronize()
        self.profiled_s += self.now_s() - self._mark_s
        self.profiled_steps += self._count
        self._profiler.step()
        self.stop()
        self._collect(self.folder / f"round-{self.rounds}.json", range(self._first, ended + 1))
        if self.missing() and self.profiled_steps < self.max_steps:
            self.start()
            return False
        self.stand_in()
        return True

    def _collect(self, recording: Path, steps: range) -> None:
        for position, step in enumerate(steps):
            shape = self.probe.shape_of(step)
            if shape is None or (shape in self.profiled and shape not in self.first_seen):
                continue
            cold = bool(self.probe.first_seen(step))
            if shape in self.profiled and cold:
                continue  # a first-seen occurrence is kept only until a warm one comes
            self.profiled[shape] = (recording, position - len(steps))
            (self.first_seen.add if cold else self.first_seen.discard)(shape)
            if shape in self.targets:
                self.captured[shape] = self.profiled[shape]

    def stand_in(self) -> None:
        """Give each target still missing the profiled step nearest it in its variables (same input layout, not captured
        yet) in its place: in a run whose shapes rarely repeat (dynamic padding) the window's exact shapes do
        not come up again, and a step near each of them covers the run's range as well. The nearest step that is
        not :attr:`first_seen` is preferred (a first-seen recording's one-time idle gaps, predicted into warm steps,
        are where a plan lowers its clocks) unless it lies farther than the nearest step by more than the step
        model's ``COVER_FACTOR`` (which would narrow the shapes it covers). The replaced targets are kept in
        :attr:`stood_in`."""
        for index, target in enumerate(list(self.targets)):
            if target in self.captured:
                continue
            free = [shape for shape in self.profiled if shape not in self.captured
                    and len(shape.inputs) == len(target.inputs) and shape.batch == target.batch]
            if not free:
                continue
            axes = ShapeAxes.of([target, *free])
            distance = {shape: _log_distance(axes, shape, target) for shape in free}
            nearest = min(free, key=lambda shape: (distance[shape], shape))
            warm = [shape for shape in free if shape not in self.first_seen]
            if warm and nearest in self.first_seen:
                closest_warm = min(warm, key=lambda shape: (distance[shape], shape))
                if distance[closest_warm] <= distance[nearest] + math.log(COVER_FACTOR):
                    nearest = closest_warm
            self.targets[index] = nearest
            self.captured[nearest] = self.profiled[nearest]
            self.stood_in[nearest] = target

    def missing(self) -> list[StepShape]:
        """The targets not recorded yet, in target order."""
        return [s for s in self.targets if s not in self.captured]

    def stop(self) -> None:
        """Stop the profiler of the round in progress (idempotent)."""
        if self._profiler is not None:
            with contextlib.suppress(RuntimeError):
                self._profiler.stop()
            self._profiler = None


def _log_distance(axes: ShapeAxes, a: StepShape, b: StepShape) -> float:
    """How far apart two shapes of ``axes`` lie: the sum of their variables' absolute log ratios."""
    return math.fsum(abs(math.log(max(x, 1) / max(y, 1))) for x, y in zip(axes.values(a), axes.values(b), strict=True))


def shape_measurements(trace: Trace, window: WindowShapes, window_s: float, avg_power_w: float | None,
                       shape: StepShape, first_seen: bool) -> dict[str, float]:
    """The measurements of the trace of ``shape`` (module docstring): its own step time and joules per step
    (when the window held enough of its steps), the whole window's seconds, steps and joules, and
    ``profiled_first_seen`` (1.0 when the profiled step was :attr:`ShapeRounds.first_seen`, else 0.0)."""
    values = dict(trace.meta.measurements)
    for key in ("step_time_s", "energy_j_per_step", "job_step_time_s"):
        values.pop(key, None)
    steps = len(window.shapes)
    values.update(window_s=window_s, window_steps=float(steps), window_step_time_s=window_s / steps,
                  shape_window_steps=float(window.counts[shape]))
    values[FIRST_SEEN_KEY] = float(first_seen)
    own_s = window.step_time_s(shape)
    if own_s is not None:
        values.update(step_time_s=own_s, job_step_time_s=own_s)
        if avg_power_w is not None:
            values["energy_j_per_step"] = avg_power_w * own_s
    fit = window.warm_fit if window.varies else None
    if fit is not None:
        values["first_seen_step_s"] = fit[2]
        values["window_first_seen_steps"] = float(sum(window.first_seen))
        values["window_stall_s"] = window.stall_s
        if avg_power_w is not None:
            values["first_seen_energy_j"] = avg_power_w * fit[2]
    if avg_power_w is not None:
        values["window_energy_j"] = avg_power_w * window_s
    return values


def shapes_report(window: WindowShapes, traces: Sequence[Trace], outputs: Sequence[str],
                  missed: Sequence[StepShape], profiled_steps: int) -> dict[str, Any]:
    """The report's ``shapes``: the window's shapes (steps, tokens), each captured shape's file, step time
    and kernels, the targets missed, the window's step-time variation and, step by step, its times and which
    paid a new shape's set-up (what the window check and the warm fit are up against: a stall shows there)."""
    seen = [{"shape": s.key, "step_shape": s.to_json(), "steps": n, "tokens": s.tokens}
            for s, n in window.distribution()]
    tokens = [s.tokens for s, _ in window.distribution()]
    captured = []
    for trace, output in zip(traces, outputs, strict=True):
        shape = trace.meta.step_shape
        assert shape is not None
        captured.append({"shape": shape.key, "step_shape": shape.to_json(), "output": output,
                         "tokens": shape.tokens, "window_steps": window.counts[shape],
                         "first_seen": is_first_seen(trace),
                         "step_time_s": trace.meta.measurements.get("step_time_s"),
                         "energy_j_per_step": trace.meta.measurements.get("energy_j_per_step"),
                         "kernels": len(trace)})
    return {"seen": seen, "tokens_range": [min(tokens), max(tokens)] if tokens else None,
            "window_steps": len(window.shapes), "captured": captured, "step_time_cv": window.time_cv(),
            "window_step_times_s": list(window.times_s), "window_first_seen": list(window.first_seen),
            "missed": [{"shape": s.key, "step_shape": s.to_json(), "window_steps": window.counts[s]} for s in missed],
            "profiled_steps": profiled_steps}


def with_shapes(trace: Trace, shape: StepShape | None, window: WindowShapes) -> Trace:
    """The trace with its step shape and the window's shape distribution in its metadata."""
    return replace(trace, meta=replace(trace.meta, step_shape=shape, shape_distribution=window.distribution()))


def output_paths(output: str, count: int) -> list[str]:
    """The files of a set of ``count`` traces: ``output``, then its ``.shape-K`` siblings."""
    return [str(shape_path(output, k)) for k in range(count)]
