"""Estimate utilisation features of kernels that have no profiler counters.

A kernel's FLOPs and DRAM bytes come from the shapes of the op that launched it (:mod:`kdvfs.envs.model.estimate_ops`);
an op that launched several kernels has its work split across them in proportion to their durations
(FLOPs only across its tensor-core kernels). Utilisations are that work over the GPU profile's roofline.
Kernels whose op does not tell their work get per-category priors measured with Nsight Compute.
Formulas, priors and validation: ``docs/design/feature-estimation.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from kdvfs.common.errors import ProfileError, TraceFormatError
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.estimate_ops import TENSOR_LIST, OpWork, conv_output_sizes, is_matmul, op_work
from kdvfs.envs.trace.trace import Category, Features, Kernel, Kind, Trace

SOURCE = "estimated"
# Kernels that run on tensor cores, by name: they carry a GEMM or attention op's FLOPs. The op's helper
# kernels (padding, workspace set-up, split-K reductions, dO.O row sums, dQ conversion) get only bytes.
TENSOR_KERNEL = re.compile(r"gemm|nvjet|cutlass|xmma|wgmma|hmma|mma_|tensorop|fprop|bprop|dgrad|wgrad|flash|fmha",
                           re.IGNORECASE)
HELPER_KERNEL = re.compile(r"workspace|padding|reduction|splitkreduce|reducesplitk", re.IGNORECASE)
# The SM-per-DRAM ratio is measured on kernels below this tensor fraction and at or above this DRAM fraction
# (1 when no measured kernel qualifies).
MAX_TENSOR_FOR_RATIO = 0.05
MIN_DRAM_FOR_RATIO = 0.05
# Streaming kernels: contiguous vectorised copies, fills and one- or two-operation arithmetic (add, mul, compare),
# and the memcpy/memset activities. They load the SMs only with their vector loads and stores, far less per byte
# than their category's other kernels (strided copies with index arithmetic, activations with transcendentals).
STREAMING_KERNEL = re.compile(r"vectorized_elementwise_kernel", re.IGNORECASE)
ARITHMETIC_FUNCTOR = re.compile(r"gelu|silu|sigmoid|tanh|exp|log|erf|pow_|sqrt|sin_|cos_|softplus|elu_|rand|dropout"
                                r"|philox|bernoulli|normal", re.IGNORECASE)
STREAMING_SM_PER_DRAM = 0.12
"""SM-per-DRAM ratio of streaming kernels: ncu's SM throughput over DRAM throughput of the vectorised copy, fill and
add kernels in the bundled H200 ncu exports (derivation: ``docs/design/feature-estimation.md``)."""
SIMT_GEMM_SM_PER_FLOP = 1.41
"""SM load of a GEMM off the tensor cores (fp32 SIMT, FFMA) per unit of its FLOP fraction: such a GEMM is issue-bound,
its FFMAs sharing the SMs' issue slots with the shared-memory loads and address arithmetic that feed them, so a
well-tuned one loads every SM fully below the fp32 peak: one over the FLOP fraction of the H200 fp32 GEMM
microbenchmark (``data/raw/h200/power_micro.json``; ``docs/design/feature-estimation.md``)."""


@dataclass(frozen=True)
class CategoryPrior:
    """Typical features of one category (fractions in [0, 1]) and its SM-per-DRAM activity ratio.

    ``sm_per_dram`` is the duration-weighted mean sm_util over the mean dram_util of the category's kernels
    that use no tensor cores: the instruction-throughput proxy for kernels whose FLOPs do not load the SMs.
    """

    sm_util: float
    dram_util: float
    tensor_util: float
    sm_per_dram: float


# Duration-weighted medians over the ncu-enriched kernels of the bundled h200/gpt3xl-1layer-b4 and
# h200/resnet50-b128 traces (derivation: docs/results.md). Communication has no measured kernel: assumed
# features (below).
COMMUNICATION_FEATURES = (0.1, 0.05, 0.0)
"""sm_util, dram_util, tensor_util assumed for a communication kernel without its op's work: NCCL holds a few
SMs polling for the other ranks' data (about 16-32 of an H200's 132) and moves little DRAM traffic while it
waits; unmeasured (``docs/design/cost-model.md``)."""
FEATURE_PRIORS: Mapping[Category, CategoryPrior] = {
    Category.GEMM: CategoryPrior(0.841, 0.189, 0.841, 0.544),
    Category.ATTENTION: CategoryPrior(0.508, 0.171, 0.508, 0.37),
    Category.ELEMENTWISE: CategoryPrior(0.396, 0.792, 0.0, 0.467),
    Category.NORM: CategoryPrior(0.367, 0.157, 0.016, 1.361),
    Category.SOFTMAX_LOSS: CategoryPrior(0.308, 0.883, 0.001, 0.518),
    Category.REDUCTION: CategoryPrior(0.708, 0.222, 0.001, 1.939),
    Category.OPTIMIZER: CategoryPrior(0.204, 0.713, 0.0, 0.416),
    Category.COPY_MEMSET: CategoryPrior(0.547, 0.446, 0.0, 0.57),
    Category.EMBEDDING: CategoryPrior(0.093, 0.078, 0.0, 0.534),
    Category.COMMUNICATION: CategoryPrior(*COMMUNICATION_FEATURES, 0.712),
    Category.OTHER: CategoryPrior(0.497, 0.204, 0.0, 1.093),
}


@dataclass(frozen=True)
class KernelWork:
    """Work attributed to one kernel: FLOPs, DRAM bytes, roofline precision, whether on tensor cores."""

    flops: float
    dram_bytes: float
    precision: str
    tensor_cores: bool


def estimate_work(kernel: Kernel,
                  conv_outputs: Mapping[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, ...]] | None = None,
                  ) -> tuple[float | None, float | None]:
    """FLOPs and DRAM bytes of the op call that launched ``kernel`` (all its kernels together).

    Memsets and memcpys return (0, the bytes the importer recorded). (None, None) when nothing tells.
    :func:`estimate_features` splits an op's work across the kernels it launched.
    """
    if kernel.kind is not Kind.KERNEL:
        return 0.0, kernel.dram_bytes
    work = op_work(kernel.op, kernel.category, kernel.name, conv_outputs) if kernel.op else None
    return (work.flops, work.dram_bytes) if work else (None, None)


def op_calls(kernels: Sequence[Kernel]) -> list[list[int]]:
    """Indices of the kernels (kind KERNEL, with an op) launched by each op call, in launch order.

    Consecutive activities with equal op info form a run. A matrix-multiply run holds one call per
    tensor-core kernel (dX and dW of a square layer record equal shapes); another run whose kernel names
    repeat with a shorter period holds that many calls; ops taking tensor lists launch chunks of one call.
    """
    runs: list[list[int]] = []
    previous: Kernel | None = None
    for index, kernel in enumerate(kernels):
        if kernel.kind is Kind.KERNEL and kernel.op is not None:
            if runs and previous is not None and previous.op == kernel.op == kernels[runs[-1][-1]].op:
                runs[-1].append(index)
            else:
                runs.append([index])
        previous = kernel
    return [call for run in runs for call in _split_run(kernels, run)]


def is_tensor_kernel(name: str) -> bool:
    """Whether a kernel name is that of a tensor-core GEMM, convolution or attention kernel."""
    return bool(TENSOR_KERNEL.search(name)) and not HELPER_KERNEL.search(name)


def _split_run(kernels: Sequence[Kernel], run: list[int]) -> list[list[int]]:
    """The calls in one run of consecutive kernels with equal op info (see :func:`op_calls`)."""
    op = kernels[run[0]].op
    if op is not None and TENSOR_LIST in op.input_types:
        return [run]
    if op is not None and is_matmul(op.name):  # one call per tensor-core kernel, helpers join the one before
        starts = [n for n, i in enumerate(run) if n == 0 or is_tensor_kernel(kernels[i].name)]
        return [run[a:b] for a, b in zip(starts, [*starts[1:], len(run)], strict=True)]
    names = [kernels[i].name for i in run]
    period = next(p for p in range(1, len(names) + 1)
                  if len(names) % p == 0 and names == names[:p] * (len(names) // p))
    return [run[start:start + period] for start in range(0, len(run), period)]


def _shares(durations_s: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Fractions of a total given to each kernel: proportional to duration, among ``mask`` only."""
    weights = np.where(mask, durations_s, 0.0)
    return weights / weights.sum()


def _split_call(kernels: Sequence[Kernel], call: Sequence[int], work: OpWork) -> dict[int, KernelWork]:
    """Bytes to every kernel of the call, FLOPs to its tensor-core kernels (all when none is recognised)."""
    durations_s = np.array([kernels[i].duration_s for i in call])
    tensor = np.array([work.tensor_cores and is_tensor_kernel(kernels[i].name) for i in call])
    if not tensor.any():
        tensor = np.full(len(call), work.tensor_cores)
    flop_shares = _shares(durations_s, tensor if tensor.any() else np.ones_like(tensor))
    byte_shares = _shares(durations_s, np.ones_like(tensor))
    return {i: KernelWork(work.flops * f, work.dram_bytes * b, work.precision, bool(t))
            for i, f, b, t in zip(call, flop_shares, byte_shares, tensor, strict=True)}


def split_work(trace: Trace) -> list[KernelWork | None]:
    """Work of every kernel of the trace, or None where neither the kernel nor its op tells it.

    Values already on a kernel (``flops``, ``dram_bytes``) win over the estimate.
    """
    conv_outputs = conv_output_sizes(k.op for k in trace.kernels if k.op is not None)
    estimated: dict[int, KernelWork] = {}
    for call in op_calls(trace.kernels):
        first = trace.kernels[call[0]]
        names = " ".join(trace.kernels[i].name for i in call)
        work = op_work(first.op, first.category, names, conv_outputs) if first.op else None
        if work is not None:
            estimated.update(_split_call(trace.kernels, call, work))
    return [_own_work(kernel, estimated.get(i)) for i, kernel in enumerate(trace.kernels)]


def _own_work(kernel: Kernel, estimate: KernelWork | None) -> KernelWork | None:
    """Combine the kernel's own flops/bytes with the estimate; GEMM/attention without an op count as bf16."""
    if estimate is None:
        if kernel.dram_bytes is None and kernel.flops is None:
            return None
        tensor = kernel.kind is Kind.KERNEL and kernel.category in (Category.GEMM, Category.ATTENTION)
        estimate = KernelWork(0.0, 0.0, "bf16" if tensor else "fp32", tensor)
    return replace(estimate,
                   flops=estimate.flops if kernel.flops is None else kernel.flops,
                   dram_bytes=estimate.dram_bytes if kernel.dram_bytes is None else kernel.dram_bytes)


def _peak_flops(profile: GpuProfile, precision: str) -> float:
    peak = profile.roofline.peak_flops.get(precision)
    if peak is None:
        raise ProfileError(f"GPU profile {profile.name!r} has no roofline.peak_flops.{precision}; add it to "
                           "estimate the utilisation of kernels at that precision")
    return peak


def _clip(value: float) -> float:
    return float(min(1.0, max(0.0, value)))


def is_streaming(kernel: Kernel) -> bool:
    """Whether a kernel streams memory with little arithmetic per byte (see :data:`STREAMING_KERNEL`)."""
    if kernel.kind is not Kind.KERNEL:
        return True
    return bool(STREAMING_KERNEL.search(kernel.name)) and not ARITHMETIC_FUNCTOR.search(kernel.name)


def kernel_features(kernel: Kernel, work: KernelWork, profile: GpuProfile, prior: CategoryPrior) -> Features:
    """Features of one kernel from its work over the roofline (utilisations clipped to [0, 1]).

    The FLOP fraction is FLOP/s over the peak of the work's precision on tensor cores, else over the fp32
    (fp64) peak; it is also the tensor_util of tensor-core kernels (0 for others). sm_util is the larger of
    the SM load of the FLOPs (the FLOP fraction; times :data:`SIMT_GEMM_SM_PER_FLOP` for a GEMM off the tensor
    cores) and the SM-per-DRAM ratio times dram_util (SM throughput is the busiest of the SM's units; memory
    instructions load them in proportion to the traffic): the category's ratio, or
    :data:`STREAMING_SM_PER_DRAM` for a streaming kernel.
    """
    dram_util = _clip(work.dram_bytes / kernel.duration_s / profile.roofline.dram_bandwidth_bytes_per_s)
    precision = work.precision if work.tensor_cores else "fp64" if work.precision == "fp64" else "fp32"
    flop_util = _clip(work.flops / kernel.duration_s / _peak_flops(profile, precision))
    simt_gemm = kernel.category is Category.GEMM and not work.tensor_cores
    flop_load = flop_util * (SIMT_GEMM_SM_PER_FLOP if simt_gemm else 1.0)
    sm_util = _clip(max(flop_load, (STREAMING_SM_PER_DRAM if is_streaming(kernel) else prior.sm_per_dram) * dram_util))
    return Features(sm_util, dram_util, flop_util if work.tensor_cores else 0.0, None, SOURCE)


def estimate_features(trace: Trace, profile: GpuProfile,
                      priors: Mapping[Category, CategoryPrior] = FEATURE_PRIORS) -> Trace:
    """A new trace in which every kernel without features gets estimated ones (source ``"estimated"``).

    Kernels with features are left unchanged. The others get ``flops``/``dram_bytes`` where those were
    unset and their op tells them, and features from that work; when nothing tells, their category's prior.
    """
    kernels = list(trace.kernels)
    for index, (kernel, work) in enumerate(zip(trace.kernels, split_work(trace), strict=True)):
        if kernel.features is not None:
            continue
        prior = priors[kernel.category]
        if work is None:
            features = Features(prior.sm_util, prior.dram_util, prior.tensor_util, None, SOURCE)
            kernels[index] = replace(kernel, features=features)
        else:
            kernels[index] = replace(kernel, flops=work.flops, dram_bytes=work.dram_bytes,
                                     features=kernel_features(kernel, work, profile, prior))
    return replace(trace, kernels=tuple(kernels))


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, cumulative[-1] / 2.0)])


def _sm_per_dram(rows: np.ndarray) -> float | None:
    """Duration-weighted SM-per-DRAM ratio of the memory-active kernels without tensor-core use, if any."""
    durations_s, sm, dram, tensor = rows.T
    scalar = (dram >= MIN_DRAM_FOR_RATIO) & (tensor < MAX_TENSOR_FOR_RATIO)
    weights = durations_s[scalar]
    return round(float(weights @ sm[scalar] / (weights @ dram[scalar])), 3) if scalar.any() else None


def _prior_of(rows: np.ndarray, fallback_sm_per_dram: float) -> CategoryPrior:
    """Prior from rows (duration_s, sm_util, dram_util, tensor_util) of measured kernels."""
    durations_s, sm, dram, tensor = rows.T
    sm_util, dram_util, tensor_util = (round(_weighted_median(v, durations_s), 3) for v in (sm, dram, tensor))
    ratio = _sm_per_dram(rows)
    return CategoryPrior(sm_util, dram_util, tensor_util, fallback_sm_per_dram if ratio is None else ratio)


def derive_priors(traces: Iterable[Trace], source_prefix: str = "ncu:") -> dict[Category, CategoryPrior]:
    """Duration-weighted median features per category of the kernels whose features came from ncu.

    Categories without a measured kernel get the values of all measured kernels together (communication:
    :data:`COMMUNICATION_FEATURES`); categories without a memory-active kernel off the tensor cores get the
    SM-per-DRAM ratio of all such kernels.
    """
    rows: dict[Category, list[tuple[float, float, float, float]]] = {}
    for trace in traces:
        for k in trace.kernels:
            if k.features is not None and k.features.source.startswith(source_prefix):
                tensor = k.features.tensor_util or 0.0
                rows.setdefault(k.category, []).append((k.duration_s, k.features.sm_util, k.features.dram_util,
                                                        tensor))
    if not rows:
        raise TraceFormatError(f"no kernel has features from {source_prefix!r}; pass ncu-enriched traces")
    every = np.array([row for values in rows.values() for row in values])
    overall = _prior_of(every, _sm_per_dram(every) or 1.0)
    assumed = {Category.COMMUNICATION: CategoryPrior(*COMMUNICATION_FEATURES, overall.sm_per_dram)}
    return {c: _prior_of(np.array(rows[c]), overall.sm_per_dram) if c in rows else assumed.get(c, overall)
            for c in Category}
