"""Synthetic training-step traces of transformer workloads, priced on a GPU profile's roofline.

A :class:`TransformerConfig` (presets in ``configs/workloads/*.yaml``) describes a pre-LN GPT (or BERT-like
encoder) trained with AdamW under autocast; :func:`generate_transformer_trace` turns it into the
:class:`~kdvfs.envs.trace.trace.Trace` PyTorch would record for one step on a
:class:`~kdvfs.envs.gpu.profiles.GpuProfile`.
The kernel sequence, FLOPs and bytes come from :mod:`kdvfs.envs.synthetic.kernels`. Each kernel lasts

    duration = floor + overhead[class] + max(flops / (peak * compute_eff[class]),
                                             dram_bytes / (bandwidth * memory_eff[class]))

with ``peak = roofline.peak_flops[precision]`` for tensor-core work (GEMMs, flash attention in bf16/fp16),
else ``peak_flops["fp32"]`` (CUDA cores), and ``bandwidth = roofline.dram_bandwidth_bytes_per_s``.
``floor`` is KERNEL_FLOOR_S (1.3 us; memsets MEMSET_FLOOR_S, 1.0 us): the shortest kernels in the H200
traces take 0.7-1.6 us. Every activity is preceded by GAP_S (1.5 us), the median idle gap between kernels in
the H200 traces (the CPU runs ahead, so the gap is the GPU's launch-to-launch latency); after a host sync (a
device-to-host copy the CPU waits for, as a mixture of experts' routing makes) the gap is SYNC_GAP_S (50 us), the
median gap after such a copy in the captured H200 MoE steps (the CPU must launch again from an empty queue).

Efficiency constants (fractions of the datasheet peak; ``overhead`` in seconds). They were read off
per-kernel throughput in the bundled H200 trace ``h200/gpt3xl-24layer-b4`` (FLOPs or bytes of each kernel
class over its measured duration, rounded), so they include the power-capped clocks the GPU runs GEMMs at
(~1.6 GHz of 1.98 GHz). The gpt2s trace (other shapes, head dim 64) set none of them; it is the more
independent check (docs/design/synthetic-traces.md says what else was chosen looking at it).

=========== ======= ====== ========== ==================================================================
class       compute memory overhead   kernels; evidence (H200 trace)
=========== ======= ====== ========== ==================================================================
gemm        0.77    0.80   5 us       cuBLAS nvjet GEMMs, 70-79 % of 989 TFLOP/s at 69-1690 GFLOP
flash_fwd   0.45    0.80   0          cuDNN flash fprop, causal FLOPs; x sqrt(head_dim/128) below 128
flash_bwd   0.41    0.80   0          cuDNN flash bprop (2.5x forward FLOPs); same head-dim factor
attn_aux    0.50    0.55   0          dO.O row sums and dQ fp32->16-bit conversion around the bprop
vector      0.50    0.92   0          vectorized casts to 16 bit, fills, cat, fp32 in-place adds: 4.1-4.7 TB/s
cast_up     0.50    0.42   0          unrolled 16-bit -> fp32 gradient casts: ~2.0 TB/s
mixed       0.50    0.55   0          residual add of fp32 + 16-bit (unrolled, mixed dtype): ~2.6 TB/s
activation  0.50    0.60   0          GELU forward/backward: 2.7-3.0 TB/s
norm        0.50    0.57   0          layer norm forward, input grad, gamma/beta grad: 2.5-2.9 TB/s
softmax     0.50    0.85   0          log-softmax over vocab rows (4 passes over the logits)
reduce      0.50    0.90   16 us      column sums for bias grads (two-stage, preceded by a memset)
gather      0.50    0.70   0          embedding row gathers: ~3.3 TB/s
segment     0.50    0.11   0          embedding backward segment sums / atomics: ~0.5 TB/s
sort        0.50    0.50   5 us       CUB radix-sort passes (a few blocks, latency bound): 4-8 us
serial      0.50    0.50   15 us      single-block NLL loss forward/backward: 13-20 us
tiny        0.50    0.50   0          arange, scalar fills, step counters: ~1-2 us
optimizer   0.50    0.72   0          multi_tensor_apply AdamW, 28 B/parameter: ~3.5 TB/s
memset      0.50    0.92   0          cuBLAS/cuDNN/CUB workspace memsets: ~1 us
=========== ======= ====== ========== ==================================================================

The compute efficiency 0.50 of the CUDA-core classes is nominal: their FLOPs never set their duration.

With ``rng_seed`` every duration is multiplied by ``exp(N(0, NOISE_SIGMA))``, NOISE_SIGMA = 0.02: the median
coefficient of variation of identical kernels repeated within one H200 step. Features are derived from the
(noisy) duration: ``sm_util`` = achieved FLOP/s over the peak used above, ``tensor_util`` the same for
tensor-core kernels (0 otherwise), ``dram_util`` = achieved bytes/s over the bandwidth, all clipped to [0, 1].
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
from kdvfs.envs.synthetic.kernels import step_specs
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
    specs = step_specs(config)
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
    meta = TraceMeta(gpu=profile.model, workload=config.name,
                     source=f"synthetic:{config.summary()} seed={rng_seed}",
                     ref_mem_mhz=float(profile.clocks.default_memory_mhz), ref_core_mhz=None,
                     step_shape=StepShape.of([(config.batch, config.seq)]))
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
