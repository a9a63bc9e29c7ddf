"""Synthetic training-step traces of transformer workloads, priced on a GPU profile's roofline.

A :class:`TransformerConfig` (presets in ``configs/workloads/*.yaml``) describes a pre-LN GPT (or BERT-like
encoder) trained with AdamW under autocast; :func:`generate_transformer_trace` turns it into the
:class:`~kdvfs.envs.trace.trace.Trace` PyTorch would record for one step on a
:class:`~kdvfs.envs.gpu.profiles.GpuProfile`, at default ("auto") clocks. The kernels, FLOPs and bytes come
from :mod:`kdvfs.envs.synthetic.kernels`; each lasts ``floor + overhead[class] + max(flops / (peak *
compute_eff[class]), bytes / (bandwidth * memory_eff[class]))`` (seconds; efficiencies are fractions of the
roofline's peaks, ``EFFICIENCY``), preceded by ``GAP_S`` or, after a host sync, ``SYNC_GAP_S``.

With ``rng_seed`` every duration is multiplied by ``exp(N(0, NOISE_SIGMA))``; ``None`` is deterministic.
Features are the achieved fractions of the peaks the kernel was priced against, clipped to [0, 1]. Where each
constant comes from (the H200 traces) and what it leaves out: ``docs/design/synthetic-traces.md``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np

from kdvfs.common.config import ConfigError, from_mapping, load_yaml
from kdvfs.common.errors import StepDetectionError
from kdvfs.common.paths import CONFIG_DIR
from kdvfs.common.resolve import resolve_shipped, shipped_names
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.synthetic.kernel_builder import Eff, Spec
from kdvfs.envs.synthetic.kernels import encoder_decoder_specs, step_specs
from kdvfs.envs.synthetic.workload import TransformerConfig
from kdvfs.envs.trace.shape import StepShape
from kdvfs.envs.trace.trace import Features, Kernel, Kind, Phase, Trace, TraceMeta

WORKLOAD_DIR = CONFIG_DIR / "workloads"
KERNEL_FLOOR_S = 1.3e-6
MEMSET_FLOOR_S = 1.0e-6
GAP_S = 1.5e-6
SYNC_GAP_S = 50e-6
NOISE_SIGMA = 0.02
FLASH_REFERENCE_HEAD_DIM = 128


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions of peak compute and DRAM bandwidth, and a fixed extra time (seconds)."""

    compute: float
    memory: float
    overhead_s: float = 0.0


EFFICIENCY: Mapping[Eff, Efficiency] = MappingProxyType({
    Eff.GEMM: Efficiency(0.77, 0.80, 5e-6), Eff.FLASH_FWD: Efficiency(0.45, 0.80),
    Eff.FLASH_BWD: Efficiency(0.41, 0.80), Eff.ATTN_AUX: Efficiency(0.50, 0.55),
    Eff.VECTOR: Efficiency(0.50, 0.92), Eff.CAST_UP: Efficiency(0.50, 0.42), Eff.MIXED: Efficiency(0.50, 0.55),
    Eff.ACTIVATION: Efficiency(0.50, 0.60), Eff.NORM: Efficiency(0.50, 0.57), Eff.SOFTMAX: Efficiency(0.50, 0.85),
    Eff.REDUCE: Efficiency(0.50, 0.90, 16e-6), Eff.GATHER: Efficiency(0.50, 0.70),
    Eff.SEGMENT: Efficiency(0.50, 0.11), Eff.SORT: Efficiency(0.50, 0.50, 5e-6),
    Eff.SERIAL: Efficiency(0.50, 0.50, 15e-6), Eff.TINY: Efficiency(0.50, 0.50),
    Eff.OPTIMIZER: Efficiency(0.50, 0.72), Eff.MEMSET: Efficiency(0.50, 0.92),
})


def available_workloads() -> list[str]:
    """Names of the presets shipped in ``configs/workloads``."""
    return shipped_names(WORKLOAD_DIR, ".yaml")


def load_workload(name_or_path: str | Path) -> TransformerConfig:
    """Load a workload preset by name (``gpt3xl``) or from a YAML file path; unknown keys are errors."""
    path = resolve_shipped(name_or_path, WORKLOAD_DIR, ".yaml", "workload", error=ConfigError)
    config = from_mapping(TransformerConfig, load_yaml(path), str(path))
    if path.parent == WORKLOAD_DIR and config.name != path.stem:
        raise ConfigError(f"{path}: name {config.name!r} must match the file name {path.stem!r}")
    return config


def _durations(specs: list[Spec], config: TransformerConfig, profile: GpuProfile) -> tuple[np.ndarray, np.ndarray]:
    """Roofline durations (seconds) and the peak FLOP/s each kernel's compute is measured against."""
    peaks = profile.roofline.peak_flops
    if config.precision not in peaks:
        raise ConfigError(f"workload {config.name!r}: precision {config.precision!r} has no entry in GPU profile "
                          f"{profile.name!r} roofline.peak_flops (has {sorted(peaks)}); use one of those")
    flash = math.sqrt(min(config.d_model // config.heads, FLASH_REFERENCE_HEAD_DIM) / FLASH_REFERENCE_HEAD_DIM)
    eff = [EFFICIENCY[s.eff] for s in specs]
    compute_eff = np.array([e.compute * (flash if s.eff in (Eff.FLASH_FWD, Eff.FLASH_BWD) else 1.0)
                            for s, e in zip(specs, eff, strict=True)])
    peak = np.array([peaks[config.precision] if s.tensor else peaks.get("fp32", peaks[config.precision])
                     for s in specs])
    flops = np.array([s.flops for s in specs])
    nbytes = np.array([s.dram_bytes for s in specs])
    floor = np.array([MEMSET_FLOOR_S if s.kind is Kind.MEMSET else KERNEL_FLOOR_S for s in specs])
    overhead = np.array([e.overhead_s for e in eff])
    memory_s = nbytes / (profile.roofline.dram_bandwidth_bytes_per_s * np.array([e.memory for e in eff]))
    return floor + overhead + np.maximum(flops / (peak * compute_eff), memory_s), peak


def generate_transformer_trace(config: TransformerConfig, profile: GpuProfile, rng_seed: int | None = None) -> Trace:
    """The kernel trace of one training step of ``config`` on ``profile`` at default clocks.

    Args:
        config: the workload.
        profile: the GPU; its roofline prices the kernels.
        rng_seed: None for deterministic roofline durations; an integer for reproducible multiplicative
            log-normal noise (sigma NOISE_SIGMA) on every duration.

    Raises:
        ConfigError: the profile has no peak FLOP/s for the workload's precision.
    """
    meta = TraceMeta(gpu=profile.model, workload=config.name, source=f"synthetic:{config.summary()} seed={rng_seed}",
                     ref_mem_mhz=float(profile.clocks.default_memory_mhz), ref_core_mhz=None,
                     step_shape=StepShape.of([(config.batch, config.seq)]))
    return _priced(step_specs(config), config, profile, rng_seed, meta)


def generate_encoder_decoder_trace(encoder: TransformerConfig, decoder: TransformerConfig, profile: GpuProfile,
                                   rng_seed: int | None = None) -> Trace:
    """The kernel trace of one encoder-decoder training step
    (:func:`~kdvfs.envs.synthetic.kernels.encoder_decoder_specs`: ``encoder.seq`` input tokens, ``decoder.seq``
    label tokens per sequence), priced and seeded as :func:`generate_transformer_trace`'s. Its step shape is keyed
    like a T5's under the HF Trainer: ``attention_mask``, ``decoder_input_ids``, ``input_ids``, ``labels`` and the
    scalar item count. Raises :class:`ConfigError` as that function does, and for stacks of different batch or
    precision."""
    batch, source, target = encoder.batch, encoder.seq, decoder.seq
    shape = StepShape.of([(batch, source), (batch, target), (batch, source), (batch, target), ()])
    meta = TraceMeta(gpu=profile.model, workload=f"{encoder.name}+{decoder.name}",
                     source=f"synthetic:{encoder.summary()} + {decoder.summary()} seed={rng_seed}",
                     ref_mem_mhz=float(profile.clocks.default_memory_mhz), ref_core_mhz=None, step_shape=shape)
    return _priced(encoder_decoder_specs(encoder, decoder), decoder, profile, rng_seed, meta)


def _priced(specs: list[Spec], config: TransformerConfig, profile: GpuProfile, rng_seed: int | None,
            meta: TraceMeta) -> Trace:
    """``specs`` as kernels priced on ``profile`` (``config``'s precision and head size; module docstring)."""
    durations, peak = _durations(specs, config, profile)
    if rng_seed is not None:
        durations = durations * np.exp(np.random.default_rng(rng_seed).normal(0.0, NOISE_SIGMA, len(specs)))
    compute = np.clip(np.array([s.flops for s in specs]) / (durations * peak), 0.0, 1.0)
    dram = np.clip(np.array([s.dram_bytes for s in specs]) / (durations * profile.roofline.dram_bandwidth_bytes_per_s),
                   0.0, 1.0)
    gaps = [GAP_S] + [SYNC_GAP_S if before.host_sync else GAP_S for before in specs[:-1]]
    kernels = tuple(
        Kernel(name=s.name, kind=s.kind, category=s.category, phase=s.phase, duration_s=float(duration),
               gap_before_s=gap, op=s.op, flops=s.flops, dram_bytes=s.dram_bytes,
               features=Features(sm_util=float(c), dram_util=float(m), tensor_util=float(c) if s.tensor else 0.0,
                                 clock_mhz=None, source="synthetic"))
        for s, duration, gap, c, m in zip(specs, durations, gaps, compute, dram, strict=True))
    return Trace(meta=meta, kernels=kernels)


def _pattern_period(signatures: Sequence[Hashable], layers: int) -> int:
    """Shortest period p whose repetition covers the longest stretch of ``signatures`` (about layers * p)."""
    ids = {sig: i for i, sig in enumerate(dict.fromkeys(signatures))}
    seq = np.array([ids[sig] for sig in signatures])
    best_period, best_cover = 0, 0
    for period in range(1, len(seq) // layers + 1):
        same = np.concatenate(([False], seq[period:] == seq[:-period], [False]))
        edges = np.flatnonzero(np.diff(same.astype(np.int8)))
        longest = int((edges[1::2] - edges[::2]).max(initial=0))
        if longest >= period * (layers - 1) and longest + period > best_cover:
            best_period, best_cover = period, longest + period
    return best_period


def layer_kernel_counts(trace: Trace, layers: int) -> tuple[int, int]:
    """(kernels per layer, non-layer kernels) of a transformer step, from its repeating kernel pattern.

    Only activities of kind kernel count (memsets do not). In the forward and in the backward phase, the
    per-layer count is the shortest period with which the (name, op, input shapes) sequence repeats over
    at least ``layers`` copies; non-layer kernels are the rest (embedding, head, loss, optimizer).
    """
    if layers < 2:
        raise StepDetectionError(f"need at least 2 layers to find the repeating layer pattern, got {layers}")
    per_layer = 0
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        signatures = [(k.name, k.op.name if k.op else None, k.op.input_dims if k.op else None)
                      for k in trace.kernels if k.kind is Kind.KERNEL and k.phase is phase]
        period = _pattern_period(signatures, layers)
        if period == 0:
            raise StepDetectionError(f"trace {trace.meta.workload!r}: no kernel pattern repeats {layers} times in "
                                     f"the {phase} phase; is layers={layers} right?")
        per_layer += period
    return per_layer, trace.count(Kind.KERNEL) - layers * per_layer
