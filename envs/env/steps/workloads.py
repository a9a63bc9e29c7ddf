"""Training and held-out steps for learned policies: bundled real traces and generated transformer steps.

A :class:`WorkloadSet` names bundled traces, workload presets generated as they are, seeded samples
of variants of presets (layers, batch, sequence length, precision, fused or not), and families of steps at
several shapes whose episodes execute other steps than the controller expects
(:mod:`kdvfs.envs.env.steps.shape_pairs`). A :class:`DataSplit` holds the training set and the held-out set and
refuses a split in which a held-out *family* (a preset, or the model of a bundled trace: ``h200/gpt2s-b16`` is
family ``gpt2s``) also appears in training.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kdvfs.common.config import ConfigError
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.steps.clock_grid import ClockGrid
from kdvfs.envs.env.steps.shape_pairs import ShapePair, ShapeSet
from kdvfs.envs.env.steps.step_data import StepData
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.synthetic.generator import generate_transformer_trace, load_workload
from kdvfs.envs.synthetic.workload import TransformerConfig
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.trace import Trace


@dataclass(frozen=True)
class Variants:
    """A seeded sample of generated variants of workload presets.

    Attributes:
        workloads: presets (``configs/workloads/<name>.yaml``) to vary.
        layers: layer counts to draw from.
        batch_scales: factors on the preset's batch size (rounded, at least 1).
        seqs: sequence lengths.
        precisions: ``bf16``, ``fp16`` or ``fp32``.
        fused: fused attention and optimizer, or the plain code path.
        per_workload: how many distinct combinations to draw per preset.
        seed: seeds the draw and each variant's duration noise.
    """

    workloads: tuple[str, ...]
    layers: tuple[int, ...]
    batch_scales: tuple[float, ...]
    seqs: tuple[int, ...]
    precisions: tuple[str, ...]
    fused: tuple[bool, ...]
    per_workload: int
    seed: int = 0

    def configs(self) -> list[TransformerConfig]:
        """The drawn variants, named ``<preset>-L<layers>-b<batch>-s<seq>-<precision>[-unfused]``."""
        rng = np.random.default_rng(self.seed)
        combos = list(itertools.product(self.layers, self.batch_scales, self.seqs, self.precisions, self.fused))
        drawn = []
        for workload in self.workloads:
            preset = load_workload(workload)
            picks = rng.choice(len(combos), size=min(self.per_workload, len(combos)), replace=False)
            for layers, scale, seq, precision, fused in (combos[i] for i in sorted(picks)):
                batch = max(1, round(preset.batch * scale))
                name = f"{workload}-L{layers}-b{batch}-s{seq}-{precision}{'' if fused else '-unfused'}"
                drawn.append(replace(preset, name=name, layers=layers, batch=batch, seq=seq, precision=precision,
                                     fused=fused))
        return drawn


@dataclass(frozen=True)
class WorkloadSet:
    """Steps to train or evaluate on.

    Attributes:
        bundled: bundled traces (``gpu/workload``), only for the GPU they were recorded on.
        presets: workload presets, generated as they are (deterministic durations).
        variants: generated variants of presets, or None.
        shapes: families of generated steps at several shapes, as (predicted, executed) pairs, or None.
    """

    bundled: tuple[str, ...] = ()
    presets: tuple[str, ...] = ()
    variants: Variants | None = None
    shapes: ShapeSet | None = None

    def families(self) -> set[str]:
        """The workload families the set draws on."""
        return ({family_of(name) for name in self.bundled} | set(self.presets)
                | set(self.variants.workloads if self.variants else ()) | set(self.shapes.workloads if self.shapes
                                                                              else ()))

    def pairs(self, profile: GpuProfile, grid: ClockGrid, progress: Callable[[int], None] | None = None
              ) -> list[ShapePair]:
        """Every step of the set on ``profile``, priced on ``grid``: the traces of :meth:`traces` executing as
        observed (no executed variants), then the pairs of ``shapes``. ``progress`` is told 1 per step."""
        pairs = []
        for name, trace in self.traces(profile):
            pairs.append(ShapePair(StepData.build(name, trace, profile, grid), ()))
            if progress is not None:
                progress(1)
        return pairs + (self.shapes.pairs(profile, grid, progress) if self.shapes else [])

    def size(self) -> int:
        """How many steps :meth:`pairs` gives at most (for a progress bar)."""
        variants = len(self.variants.configs()) if self.variants else 0
        shapes = len(self.shapes.workloads) * len(self.shapes.batch_scales) * len(self.shapes.seqs) \
            if self.shapes else 0
        return len(self.bundled) + len(self.presets) + variants + shapes

    def traces(self, profile: GpuProfile) -> list[tuple[str, Trace]]:
        """(name, trace) of every step of the set on ``profile``; bundled traces of another GPU are an error."""
        foreign = [name for name in self.bundled if name.split("/")[0] != profile.name]
        if foreign:
            raise ConfigError(f"bundled traces {foreign} were not recorded on {profile.name!r}; "
                              "list only that GPU's traces under bundled")
        steps = [(name, open_trace(name)) for name in self.bundled]
        steps += [(name, generate_transformer_trace(load_workload(name), profile)) for name in self.presets]
        if self.variants:
            steps += [(config.name, generate_transformer_trace(config, profile, rng_seed=self.variants.seed + i))
                      for i, config in enumerate(self.variants.configs())]
        return steps


def family_of(bundled_name: str) -> str:
    """The workload family of a bundled trace: ``h200/gpt3xl-24layer-b4`` -> ``gpt3xl``."""
    return bundled_name.split("/")[-1].split("-")[0]


@dataclass(frozen=True)
class DataSplit:
    """Training steps, validation steps and held-out steps; training and held-out split by workload family.

    Attributes:
        train: what the policy trains on.
        held_out: what it is evaluated on; none of its families may appear in ``train``.
        held_out_families: the families kept out of training (documents the split; checked both ways).
        validation: what PPO and its clone are compared on to choose the one that ships: steps not in
            ``train`` (e.g. the training families at other shapes), none of a held-out family; empty: the
            comparison runs on the training steps.
    """

    train: WorkloadSet
    held_out: WorkloadSet
    held_out_families: tuple[str, ...]
    validation: WorkloadSet = WorkloadSet()

    def __post_init__(self) -> None:
        leaked = sorted(self.train.families() & set(self.held_out_families))
        if leaked:
            raise ConfigError(f"held-out families {leaked} also appear in the training set; remove them from train")
        unlisted = sorted(self.held_out.families() - set(self.held_out_families))
        if unlisted:
            raise ConfigError(f"held-out set uses families {unlisted} not listed in held_out_families")
        peeking = sorted(self.validation.families() & set(self.held_out_families))
        if peeking:
            raise ConfigError(f"validation set uses held-out families {peeking}; validate on other families")


def default_step(profile: GpuProfile, grid: ClockGrid | None = None) -> StepData:
    """A small step for a bare ``gym.make(ENV_ID)``: one GPT-3-XL-shaped layer, batch 1, on ``profile``, priced
    on ``grid`` (None: the default settings' grid)."""
    config = replace(load_workload("gpt3xl"), name="gpt3xl-1layer-b1", layers=1, batch=1)
    grid = EnvConfig().grid(profile) if grid is None else grid
    return StepData.build(config.name, generate_transformer_trace(config, profile), profile, grid)
