"""The step model: the kernel trace of a step of a shape never captured, from captured steps of one model.

A run whose steps change shape (dynamic padding, bucketing, MoE routing) is captured at a few shapes
(:class:`~kdvfs.envs.trace.shape.StepShape`); :meth:`StepModel.predict` gives the expected step of any other
shape near them, so the controller and the planners can decide on it as on a captured step. The kernel
sequence is the nearest capture's; every other capture is aligned to it kernel by kernel
(:mod:`kdvfs.envs.model.step.align`); each kernel's duration, gap, FLOPs and bytes, each (phase, category)
group's total time and the whole-step measurements are fitted non-negative in the shape variables
(:mod:`kdvfs.envs.model.step.shape_fit`), on the richest basis the captured shapes determine
(:func:`~kdvfs.envs.model.step.shape_fit.choose_terms`, :attr:`StepModel.terms`): never an underdetermined one;
fewer shapes than :func:`~kdvfs.envs.model.step.shape_fit.required_shapes` give a smaller basis, which
:attr:`StepModel.basis_note` says. Times in seconds.

:meth:`StepModel.covers` is False beyond ``COVER_FACTOR`` of the captured variables, for another input
structure, and for any other shape when only one was captured. Fitting is deterministic and cheap, so the
runtime refits at its start rather than storing the model. How and why: ``docs/design/step-model.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.errors import KdvfsError
from kdvfs.envs.model.estimate import split_work
from kdvfs.envs.model.step.align import align, inverse, token_ids
from kdvfs.envs.model.step.first_seen import warm_gaps
from kdvfs.envs.model.step.shape_fit import (
    Terms,
    basis,
    choose_terms,
    columns,
    cross_columns,
    fit_nonnegative,
    odd_lengths,
    required_shapes,
)
from kdvfs.envs.trace.shape import ShapeAxes, StepShape
from kdvfs.envs.trace.trace import Category, Kernel, Phase, Trace

COVER_FACTOR = 1.5
"""How far beyond the captured range a shape is still covered: each variable, length and length class within the
captured minimum / COVER_FACTOR and maximum x COVER_FACTOR."""
MIN_DURATION_S = 1e-7
"""Shortest predicted kernel (s): a fitted duration never reaches zero."""
QUANTITIES = ("duration_s", "gap_before_s", "flops", "dram_bytes")
"""The per-kernel numbers the model fits, in the order of :attr:`Template.coefficients`."""
CATEGORIES = tuple(Category)
PHASES = tuple(Phase)


class StepModelError(KdvfsError):
    """The traces cannot make a step model (no shape, mixed shapes of one key, another input structure)."""


@dataclass(frozen=True)
class Template:
    """One captured step as the template of the shapes nearest it, with its kernels' fits.

    Attributes:
        trace: the captured step.
        coefficients: (4, K, p) per kernel, the non-negative coefficients of each of ``QUANTITIES`` on the basis
            of ``axes`` and ``terms`` (:func:`~kdvfs.envs.model.step.shape_fit.basis`: ``1, tokens, batch * seq^2``
            for a step of one sequence length; zero beyond a kernel's own columns).
        observed: (4, K) on how many captured shapes each kernel's number was observed (1: the template's
            only: scaled with its category at prediction).
        categories: (K,) index of each kernel's category in ``CATEGORIES``.
        groups: (K,) index of each kernel's (phase, category) group.
        captured: (4, K) the template's own numbers (NaN where its work is unknown).
        axes: the shape variables the fits are in.
        terms: the basis the fits are on.
        odd: the variables with an odd-length column (:func:`~kdvfs.envs.model.step.shape_fit.odd_lengths`).
    """

    trace: Trace
    coefficients: Array
    observed: Array
    categories: Array
    groups: Array
    captured: Array
    axes: ShapeAxes
    terms: Terms
    odd: tuple[int, ...] = ()

    def values(self, shape: StepShape) -> Array:
        """(4, K) each quantity of each kernel at ``shape``; NaN where it has no FLOPs or bytes."""
        x = basis([shape], True, self.axes, self.terms, self.odd)[0]
        predicted = self.coefficients @ x
        lonely = self.observed <= 1
        ratio = _category_ratio(predicted, self.captured, lonely, self.categories)
        predicted = np.where(lonely, self.captured * ratio, predicted)
        return np.where(self.observed > 0, predicted, np.nan)


@dataclass(frozen=True)
class AlignedSteps:
    """Captured steps of one model, sorted by shape, with what a step model of any of them reuses: each kernel's
    numbers (``QUANTITIES``) and each pair's alignment (:mod:`kdvfs.envs.model.step.align`, the costly part:
    O(K1 x K2) a pair), so that models of several subsets (a leave-one-out check) align each pair once.

    Attributes:
        traces: the steps, sorted by shape.
        values: (4, K) each step's kernels' numbers.
        matches: ``matches[t][j]``, for each kernel of step t its partner in step j (-1: none); None for j == t.
    """

    traces: tuple[Trace, ...]
    values: tuple[Array, ...]
    matches: tuple[tuple[Array | None, ...], ...]

    @classmethod
    def of(cls, traces: Sequence[Trace]) -> AlignedSteps:
        """``traces`` checked (:meth:`StepModel.fit`'s errors), sorted and aligned pair by pair; where some are
        first-seen steps and some warm, the first-seen ones without their one-time gaps
        (:func:`~kdvfs.envs.model.step.first_seen.warm_gaps`)."""
        ordered = _checked(traces)
        matches = _pairwise(token_ids(ordered))
        ordered = warm_gaps(ordered, matches)
        return cls(tuple(ordered), tuple(_quantities(t) for t in ordered), tuple(map(tuple, matches)))

    def without(self, index: int) -> AlignedSteps:
        """These steps but the one at ``index`` (of :attr:`traces`)."""
        kept = [i for i in range(len(self.traces)) if i != index]
        return AlignedSteps(tuple(self.traces[i] for i in kept), tuple(self.values[i] for i in kept),
                            tuple(tuple(self.matches[i][j] for j in kept) for i in kept))


@dataclass(frozen=True)
class StepModel:
    """The expected step of each shape near the captured ones (see the module docstring). Immutable.

    Attributes:
        shapes: the captured shapes, sorted.
        steps: the captured steps, in the same order, aligned: each one's :class:`Template` is fitted the first
            time a prediction needs it (:meth:`template`), so that a model asked about one shape (a leave-one-out
            check, the prediction margin) fits one template, not one per captured shape.
        measurements: (M, p) coefficients of each whole-step measurement in ``measurement_keys`` (the basis of a
            kernel other than attention).
        measurement_keys: the measurements every captured step has.
        groups: (PHASES x CATEGORIES, p) coefficients of each (phase, category) group's kernel time (s), on the
            basis of an attention kernel (zero beyond the other kernels' columns but for attention groups).
        axes: the shape variables (:class:`~kdvfs.envs.trace.shape.ShapeAxes`) of the captured shapes and of the
            runs' shape distributions they carry.
        terms: the basis every fit is on (:func:`~kdvfs.envs.model.step.shape_fit.choose_terms` of the shapes).
        odd: the variables whose attention kernels have an odd-length column
            (:func:`~kdvfs.envs.model.step.shape_fit.odd_lengths` of the shapes).
    """

    shapes: tuple[StepShape, ...]
    steps: AlignedSteps
    measurements: Array
    measurement_keys: tuple[str, ...]
    groups: Array
    axes: ShapeAxes
    terms: Terms
    odd: tuple[int, ...] = ()
    _templates: dict[int, Template] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def fit(cls, traces: Sequence[Trace]) -> StepModel:
        """The model of the steps ``traces`` (one model at one or more shapes, each with ``meta.step_shape``).

        Raises:
            StepModelError: no traces, a trace without a shape, two traces of one shape, or shapes of
                different input structures.
        """
        return cls.of_aligned(AlignedSteps.of(traces))

    @classmethod
    def of_aligned(cls, steps: AlignedSteps) -> StepModel:
        """The model of ``steps`` (:meth:`fit` without aligning them again)."""
        ordered = list(steps.traces)
        shapes = tuple(t.meta.step_shape for t in ordered if t.meta.step_shape is not None)
        axes = ShapeAxes.of([*shapes, *(s for t in ordered for s, _ in t.meta.shape_distribution)])
        terms = choose_terms(shapes, axes)
        odd = odd_lengths(shapes, axes, terms)
        keys = tuple(sorted(set.intersection(*(set(t.meta.measurements) for t in ordered))))
        y = np.array([[t.meta.measurements[k] for k in keys] for t in ordered]).reshape(len(ordered), len(keys))
        coefficients = fit_nonnegative(basis(shapes, False, axes, terms), y, np.ones_like(y),
                                       cross_columns(axes, terms, False))
        return cls(shapes, steps, coefficients, keys, _group_fit(ordered, shapes, axes, terms, odd), axes, terms, odd)

    def template(self, index: int) -> Template:
        """The template of captured shape ``index`` (fitted once, on first use; any thread may ask)."""
        found = self._templates.get(index)
        if found is None:
            found = _template(list(self.steps.traces), self.shapes, list(self.steps.values), self.steps.matches,
                              index, self.axes, self.terms, self.odd)
            self._templates[index] = found
        return found

    @property
    def basis_note(self) -> str | None:
        """Why the fits are on a smaller basis than the quadratic one, with what a capture needs for it (one
        line); None on the quadratic basis."""
        if self.terms is Terms.QUADRATIC:
            return None
        return (f"{len(self.shapes)} captured shapes determine the {self.terms.value} basis only: every kernel on the "
                f"quadratic one ({columns(self.axes, Terms.QUADRATIC)} columns in {len(self.axes.variables)} "
                f"varying length(s)) needs {required_shapes(self.axes) - 1}; capture "
                f"--shapes {required_shapes(self.axes)} for a leave-one-out check on it")

    def covers(self, shape: StepShape) -> bool:
        """Whether ``shape`` lies near enough the captured shapes to be predicted (module docstring)."""
        if shape in self.shapes:
            return True
        if len(self.shapes) < 2 or _structure(shape) != _structure(self.shapes[0]):
            return False
        here = _coordinates(self.axes, shape)
        captured = [_coordinates(self.axes, s) for s in self.shapes]
        return all(min(c[i] for c in captured) / COVER_FACTOR <= value <= max(c[i] for c in captured) * COVER_FACTOR
                   for i, value in enumerate(here))

    def nearest(self, shape: StepShape) -> int:
        """Index of the captured shape nearest ``shape`` (log distance of its variables and lengths, ties: the
        first)."""
        here = np.log(np.maximum(_coordinates(self.axes, shape), 1))
        distances = [float(np.linalg.norm(here - np.log(np.maximum(_coordinates(self.axes, s), 1))))
                     for s in self.shapes]
        return int(np.argmin(distances))

    def kernel_time_s(self, shape: StepShape) -> float:
        """The expected kernel time of ``shape`` (s, at the captures' clocks): the sum of its (phase, category)
        groups' fitted totals. Microseconds to compute, for a figure per step; :meth:`predict` is its kernels."""
        return float(self.groups.sum(axis=0) @ basis([shape], True, self.axes, self.terms, self.odd)[0])

    def predict(self, shape: StepShape) -> Trace:
        """The expected step of ``shape``: the nearest captured shape's kernels with every number fitted at
        ``shape``; ``meta.step_shape`` is ``shape`` and ``meta.source`` names the captured shapes. A captured
        shape gives its own trace. Deterministic. Check :meth:`covers` first: outside it the fits extrapolate.
        """
        index = self.nearest(shape)
        if self.shapes[index] == shape:
            return self.steps.traces[index]
        template = self.template(index)
        duration, gap, flops, dram = template.values(shape)
        duration = _scaled_to_groups(duration, template.groups,
                                     self.groups @ basis([shape], True, self.axes, self.terms, self.odd)[0])
        kernels = tuple(_kernel(k, float(duration[i]), float(gap[i]), float(flops[i]), float(dram[i]))
                        for i, k in enumerate(template.trace.kernels))
        x = basis([shape], False, self.axes, self.terms)[0]
        measured = dict(zip(self.measurement_keys, (self.measurements @ x).tolist(), strict=True))
        captured = ", ".join(s.key for s in self.shapes)
        meta = replace(template.trace.meta, workload=f"{template.trace.meta.workload}~{shape.key}",
                       source=f"step-model: predicted from {captured} (template {self.shapes[index].key})",
                       step_index=None, measurements=measured, step_shape=shape, shape_distribution=())
        return Trace(meta, kernels)


def _checked(traces: Sequence[Trace]) -> list[Trace]:
    """``traces`` sorted by shape, after the checks of :meth:`StepModel.fit`."""
    if not traces:
        raise StepModelError("a step model needs at least one captured step")
    shapes = [t.meta.step_shape for t in traces]
    if any(s is None for s in shapes):
        missing = next(t.meta.workload for t in traces if t.meta.step_shape is None)
        raise StepModelError(f"trace {missing!r} has no meta.step_shape; capture it with a kdvfs that records "
                             "step shapes")
    known = [s for s in shapes if s is not None]
    if len(set(known)) < len(known):
        raise StepModelError("two traces have the same step shape; give one step per shape")
    if len({_structure(s) for s in known}) > 1:
        raise StepModelError("the traces' step shapes have different input structures: give steps of one model")
    return [t for _, t in sorted(zip(known, traces, strict=True), key=lambda pair: pair[0])]


def _structure(shape: StepShape) -> tuple[int, ...]:
    """How many inputs a shape has and how many dimensions each: what one model's steps share."""
    return tuple(len(dims) for dims in shape.inputs)


def _coordinates(axes: ShapeAxes, shape: StepShape) -> Array:
    """Where ``shape`` lies for :meth:`StepModel.covers` and :meth:`StepModel.nearest`: its variables, their
    lengths and its length classes."""
    return np.array([*axes.values(shape), *axes.length_values(shape), *axes.class_values(shape)], dtype=np.float64)


def _pairwise(tokens: list[Array]) -> list[list[Array | None]]:
    """matches[t][j]: for each kernel of trace t, its partner in trace j (-1: none); None on the diagonal."""
    n = len(tokens)
    matches: list[list[Array | None]] = [[None] * n for _ in range(n)]
    for t in range(n):
        for j in range(t + 1, n):
            forward = align(tokens[t], tokens[j])
            matches[t][j], matches[j][t] = forward, inverse(forward, len(tokens[j]))
    return matches


def _quantities(trace: Trace) -> Array:
    """(4, K) each kernel's ``QUANTITIES``: duration, gap, FLOPs and bytes (NaN where its work is unknown)."""
    work = split_work(trace)
    flops = [math.nan if w is None else w.flops for w in work]
    dram = [math.nan if w is None else w.dram_bytes for w in work]
    return np.array([trace.duration_s, trace.gap_before_s, flops, dram], dtype=np.float64)


def _template(traces: list[Trace], shapes: tuple[StepShape, ...], values: list[Array],
              matches: tuple[tuple[Array | None, ...], ...], t: int, axes: ShapeAxes, terms: Terms,
              odd: tuple[int, ...]) -> Template:
    """Trace ``t`` as a template: its kernels' partners in every trace and the fits over them."""
    kernels = len(traces[t])
    y = np.zeros((len(traces), 4, kernels))
    for j, other in enumerate(values):
        match = matches[t][j]
        partner = np.arange(kernels) if match is None else match
        y[j] = np.where(partner >= 0, other[:, np.maximum(partner, 0)], np.nan)
    weights = np.isfinite(y).astype(np.float64)
    categories = np.array([CATEGORIES.index(k.category) for k in traces[t].kernels])
    attention = categories == CATEGORIES.index(Category.ATTENTION)
    coefficients = np.zeros((4, kernels, columns(axes, terms, True, odd)))
    for is_attention, slots in ((False, ~attention), (True, attention)):
        x = basis(shapes, is_attention, axes, terms, odd)
        count = int(slots.sum())  # the four quantities' slots in one fit (each slot is fitted on its own)
        fitted = fit_nonnegative(x, y[:, :, slots].reshape(len(traces), 4 * count),
                                 weights[:, :, slots].reshape(len(traces), 4 * count),
                                 cross_columns(axes, terms, is_attention, odd))
        coefficients[:, np.flatnonzero(slots), : fitted.shape[1]] = fitted.reshape(4, count, fitted.shape[1])
    return Template(traces[t], coefficients, weights.sum(axis=0), categories, _group_of(traces[t]), values[t], axes,
                    terms, odd)


def _group_of(trace: Trace) -> Array:
    """(K,) each kernel's (phase, category) group index."""
    return np.array([PHASES.index(k.phase) * len(CATEGORIES) + CATEGORIES.index(k.category) for k in trace.kernels],
                    dtype=np.int64)


def _group_fit(traces: list[Trace], shapes: tuple[StepShape, ...], axes: ShapeAxes, terms: Terms,
               odd: tuple[int, ...]) -> Array:
    """(PHASES x CATEGORIES, p) each group's kernel time fitted over the captured steps (on ``terms``' columns
    for an attention kernel, or any other)."""
    size = len(PHASES) * len(CATEGORIES)
    totals = np.array([np.bincount(_group_of(t), t.duration_s, minlength=size) for t in traces])
    attention = np.arange(size) % len(CATEGORIES) == CATEGORIES.index(Category.ATTENTION)
    linear, quadratic = basis(shapes, False, axes, terms), basis(shapes, True, axes, terms, odd)
    coefficients = np.zeros((size, quadratic.shape[1]))
    coefficients[~attention, : linear.shape[1]] = fit_nonnegative(linear, totals[:, ~attention],
                                                                  np.ones_like(totals[:, ~attention]),
                                                                  cross_columns(axes, terms, False))
    coefficients[attention] = fit_nonnegative(quadratic, totals[:, attention], np.ones_like(totals[:, attention]),
                                              cross_columns(axes, terms, True, odd))
    return coefficients


def _scaled_to_groups(duration_s: Array, groups: Array, group_totals_s: Array) -> Array:
    """``duration_s`` with each group's kernels scaled so that they sum to its fitted total (where it has one)."""
    sums = np.bincount(groups, duration_s, minlength=len(group_totals_s))
    scale = np.where((sums > 0) & (group_totals_s > 0), group_totals_s / np.where(sums > 0, sums, 1.0), 1.0)
    return duration_s * scale[groups]


def _category_ratio(predicted: Array, template: Array, lonely: Array, categories: Array) -> Array:
    """(4, K) for each kernel, predicted over template totals of its category's kernels fitted on more than
    the template (1 where its category has none)."""
    ratio = np.ones_like(predicted)
    bins = len(CATEGORIES)
    for q in range(predicted.shape[0]):
        fitted = ~lonely[q] & np.isfinite(template[q]) & np.isfinite(predicted[q])
        top = np.bincount(categories[fitted], predicted[q, fitted], minlength=bins)
        bottom = np.bincount(categories[fitted], template[q, fitted], minlength=bins)
        per_category = np.where(bottom > 0, top / np.where(bottom > 0, bottom, 1.0), 1.0)
        ratio[q] = per_category[categories]
    return ratio


def _kernel(kernel: Kernel, duration_s: float, gap_s: float, flops: float, dram_bytes: float) -> Kernel:
    """The template ``kernel`` with predicted numbers (work kept unset where unknown)."""
    return replace(kernel, duration_s=max(duration_s, MIN_DURATION_S), gap_before_s=max(gap_s, 0.0),
                   flops=None if math.isnan(flops) else max(flops, 0.0),
                   dram_bytes=None if math.isnan(dram_bytes) else max(dram_bytes, 0.0))

