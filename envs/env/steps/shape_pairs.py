"""Episodes from pairs: the step a controller expects for a shape, and the steps the GPU executes instead.

For the step about to run a controller knows its shape (:mod:`kdvfs.envs.trace.shape`) and takes the step
model's prediction for it (:class:`~kdvfs.envs.model.step_model.StepModel`, fitted on a few captured
references); the GPU executes the real step. A :class:`ShapePair` holds both sides, priced for
``KernelDVFS-v0``: ``predicted``, what the observations and plans are computed on; ``executed``, variants of
the real step mapped onto the prediction's kernels (:meth:`~kdvfs.envs.env.steps.step_data.StepData.executed_as`):
the step itself, then copies with :class:`Perturbation`'s disturbances (a kernel class slower or faster than
fitted, launch gaps, duration noise, kernels dropped or inserted, a mixture of experts' token counts). The
environment draws each episode's executed variant from its step's pair (``executed=`` of
:class:`~kdvfs.envs.env.dvfs_env.KernelDVFSEnv`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from kdvfs.common.config import ConfigError
from kdvfs.envs.env.steps.clock_grid import ClockGrid
from kdvfs.envs.env.steps.step_data import CATEGORIES, StepData, priced
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.step_model import StepModel
from kdvfs.envs.synthetic.generator import generate_transformer_trace, load_workload
from kdvfs.envs.trace.trace import Trace


def expert_work(name: str) -> bool:
    """Whether a kernel named ``name`` is per-expert work of a generated mixture of experts
    (:mod:`kdvfs.envs.synthetic.moe`: its GEMMs, gathers, activations and scatters name the expert; the casts of
    expert weights do not depend on the tokens routed)."""
    return "expert" in name and "cast" not in name


@dataclass(frozen=True)
class Perturbation:
    """How an executed variant differs from the real step of its shape.

    Attributes:
        category_sigma: sigma of a log-normal factor on the durations of all kernels of one category
            (dimensionless; one draw per category and variant: a misprediction shared by a kernel class).
        gap_sigma: sigma of a log-normal factor on every idle gap before a kernel (one draw per variant: the
            host launching faster or slower than in the references).
        duration_sigma: sigma of a log-normal factor on each kernel's duration (dimensionless).
        dropped: share of kernels left out (a branch not taken, a kernel fused away).
        inserted: share of kernels run twice (a kernel split in two, an extra launch).
        expert_sigma: sigma of a log-normal factor on each per-expert kernel of a mixture of experts,
            normalised to keep their total (routing sends each expert a different share of the tokens).
        step_sigma: sigma of a log-normal factor on every kernel's duration (one draw per variant: the whole
            step slower or faster than predicted, as when the libraries pick other kernels at a shape the
            references did not have); 0 draws nothing.
    """

    category_sigma: float = 0.05
    gap_sigma: float = 0.3
    duration_sigma: float = 0.03
    dropped: float = 0.01
    inserted: float = 0.01
    expert_sigma: float = 0.3
    step_sigma: float = 0.0

    def apply(self, trace: Trace, rng: np.random.Generator) -> Trace:
        """A copy of ``trace`` with this perturbation drawn from ``rng`` (the first kernel always runs)."""
        kernels = list(trace.kernels)
        factor = np.exp(rng.normal(0.0, self.duration_sigma, len(kernels)))
        by_category = np.exp(rng.normal(0.0, self.category_sigma, len(CATEGORIES)))
        factor *= by_category[[CATEGORIES.index(k.category) for k in kernels]]
        if self.step_sigma > 0:
            factor *= float(np.exp(rng.normal(0.0, self.step_sigma)))
        gap = float(np.exp(rng.normal(0.0, self.gap_sigma)))
        experts = np.array([expert_work(k.name) for k in kernels])
        if experts.any():
            durations = np.array([k.duration_s for k in kernels])
            load = np.exp(rng.normal(0.0, self.expert_sigma, int(experts.sum())))
            share = durations[experts]
            factor[experts] *= load * share.sum() / (load * share).sum()
        draw = rng.random(len(kernels))
        out = []
        for i, (kernel, f) in enumerate(zip(kernels, factor, strict=True)):
            if i > 0 and draw[i] < self.dropped:
                continue
            scaled = replace(kernel, duration_s=kernel.duration_s * float(f), gap_before_s=kernel.gap_before_s * gap)
            out.append(scaled)
            if draw[i] > 1.0 - self.inserted:
                out.append(scaled)
        return Trace(trace.meta, tuple(out))


@dataclass(frozen=True)
class ShapePair:
    """What the controller expects for one shape and what the GPU executes (module docstring).

    Attributes:
        predicted: the step model's step for the shape, priced.
        executed: (V,) executed variants, each on ``predicted``'s kernels.
    """

    predicted: StepData
    executed: tuple[StepData, ...]


def pair(model: StepModel, executed: Trace, variants: int, perturbation: Perturbation, profile: GpuProfile,
         grid: ClockGrid, seed: int) -> ShapePair:
    """The pair of ``executed``'s shape: the step model's prediction for it, and ``variants`` executed variants
    (the step itself first, then perturbed copies seeded by ``seed``)."""
    shape = executed.meta.step_shape
    if shape is None:
        raise ConfigError(f"trace {executed.meta.workload!r} has no meta.step_shape")
    predicted_trace, predicted_costs = priced(model.predict(shape), profile)
    predicted = StepData.from_costs(executed.meta.workload, predicted_trace, predicted_costs, grid)
    rng = np.random.default_rng(seed)
    runs = [executed] + [perturbation.apply(executed, rng) for _ in range(variants - 1)]
    views = []
    for run in runs:
        run_trace, run_costs = priced(run, profile)
        views.append(StepData.executed_as(predicted_trace, run_trace, run_costs, grid))
    return ShapePair(predicted, tuple(views))


def shape_pairs(traces: Sequence[Trace], references: Sequence[int] | None, variants: int,
                perturbation: Perturbation, profile: GpuProfile, grid: ClockGrid, seed: int = 0,
                progress: Callable[[int], None] | None = None) -> list[ShapePair]:
    """The pairs of one model's steps ``traces`` (each with ``meta.step_shape``), one per trace.

    Args:
        references: the traces the step model is fitted on (indices); None: leave one out (each trace's
            prediction comes from the others).
        variants: executed variants per pair.
        progress: told 1 after each pair.
    """
    fixed = StepModel.fit([traces[i] for i in references]) if references is not None else None
    pairs = []
    for index, trace in enumerate(traces):
        model = fixed or StepModel.fit([t for i, t in enumerate(traces) if i != index])
        if model.covers(trace.meta.step_shape):  # type: ignore[arg-type]
            pairs.append(pair(model, trace, variants, perturbation, profile, grid, seed + index))
        if progress is not None:
            progress(1)
    return pairs


@dataclass(frozen=True)
class ShapeSet:
    """Families of generated steps at several shapes, for episodes from pairs: each preset is one family,
    generated at every (batch scale, sequence length) of the grid; a few shapes are its references.

    Attributes:
        workloads: presets (``configs/workloads/<name>.yaml``), one family each.
        layers: the layer count of every family's steps.
        batch_scales: factors on the preset's batch size (rounded, at least 1).
        seqs: sequence lengths.
        references: shapes per family the step model is fitted on, spread evenly over the family's shapes
            by tokens (the fewest and the most always among them); 0: leave one out.
        variants: executed variants per pair.
        perturbation: how the variants differ.
        seed: seeds each step's duration noise and the variants.
    """

    workloads: tuple[str, ...]
    layers: int
    batch_scales: tuple[float, ...]
    seqs: tuple[int, ...]
    references: int = 3
    variants: int = 4
    perturbation: Perturbation = Perturbation()
    seed: int = 0

    def __post_init__(self) -> None:
        shapes = len(self.batch_scales) * len(self.seqs)
        if self.variants < 1 or not 0 <= self.references < shapes or (self.references == 0 and shapes < 3):
            raise ConfigError(f"shapes: need variants >= 1 and 2 <= references < {shapes} shapes (or 0: leave "
                              "one out, with at least 3 shapes)")

    def family(self, workload: str, profile: GpuProfile) -> list[Trace]:
        """One family's steps on ``profile``, by tokens (ties: sequence length)."""
        preset = load_workload(workload)
        configs = [replace(preset, name=f"{workload}-L{self.layers}-b{max(1, round(preset.batch * s))}-s{q}",
                           layers=self.layers, batch=max(1, round(preset.batch * s)), seq=q)
                   for s, q in itertools.product(self.batch_scales, self.seqs)]
        configs = sorted({c.name: c for c in configs}.values(), key=lambda c: (c.batch * c.seq, c.seq))
        return [generate_transformer_trace(c, profile, rng_seed=self.seed + i) for i, c in enumerate(configs)]

    def reference_indices(self, count: int) -> list[int] | None:
        """Which of a family's ``count`` shapes (by tokens) are references; None: leave one out."""
        if self.references == 0:
            return None
        return sorted({round(float(i)) for i in np.linspace(0, count - 1, self.references)})

    def pairs(self, profile: GpuProfile, grid: ClockGrid, progress: Callable[[int], None] | None = None
              ) -> list[ShapePair]:
        """Every family's pairs on ``profile`` (:func:`shape_pairs`)."""
        out = []
        for number, workload in enumerate(self.workloads):
            traces = self.family(workload, profile)
            out += shape_pairs(traces, self.reference_indices(len(traces)), self.variants, self.perturbation,
                               profile, grid, self.seed + 1000 * number, progress)
        return out
