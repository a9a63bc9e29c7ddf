"""The kernel trace of one training step: an immutable, typed record of what the GPU ran.

A :class:`Trace` is the unit every other part of kdvfs works on: the cost model prices its kernels at
each clock pair, the environment replays it, planners schedule it, the runtime matches live steps to it.
Per-kernel numbers are also exposed as read-only numpy columns (shape ``(n_kernels,)``) for vectorised use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property

import numpy as np

from kdvfs.common.errors import TraceFormatError
from kdvfs.common.frozen import frozen
from kdvfs.envs.trace.shape import StepShape

MAX_ACTIVITY_S = 3600.0
"""Longest duration or idle gap of one activity (s): a kernel of a training step never lasts an hour."""
MAX_WORK = 1e21
"""Most FLOPs or DRAM bytes of one kernel: more than any GPU does in MAX_ACTIVITY_S."""
MAX_TENSOR_DIM = 2**48
"""Largest size of one tensor dimension an op may report."""
MAX_LAUNCH_DIM = 2**32
"""Launch grid and block sizes are 32-bit."""
CLOCK_RANGE_MHZ = (1.0, 100_000.0)
"""Where a GPU clock (MHz) can lie: outside, a number is no clock."""
POWER_RANGE_W = (1.0, 100_000.0)
"""Where a board power limit (W) can lie: outside, a number is no power limit."""


class Category(StrEnum):
    """What a kernel does; decides its default utilisation estimates and how it responds to clocks."""

    GEMM = "gemm"
    ATTENTION = "attention"
    ELEMENTWISE = "elementwise"
    NORM = "norm"
    SOFTMAX_LOSS = "softmax/loss"
    REDUCTION = "reduction"
    OPTIMIZER = "optimizer"
    COPY_MEMSET = "copy/memset"
    EMBEDDING = "embedding"
    COMMUNICATION = "communication"
    OTHER = "other"


class Phase(StrEnum):
    """Which part of the training step launched a kernel."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    OTHER = "other"


class Kind(StrEnum):
    """The GPU activity type as the profiler reports it."""

    KERNEL = "kernel"
    MEMSET = "memset"
    MEMCPY = "memcpy"


Dim3 = tuple[int, int, int]


def _is_count(value: object, most: int) -> bool:
    """An integer (not a bool) in [0, most]."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def _check_clock(label: str, value_mhz: float | None) -> None:
    low, high = CLOCK_RANGE_MHZ
    if value_mhz is not None and not low <= value_mhz <= high:
        raise TraceFormatError(f"{label}={value_mhz} MHz is outside [{low:g}, {high:g}] MHz")


@dataclass(frozen=True)
class Features:
    """Hardware-counter features of one kernel at the trace's reference clocks.

    Attributes:
        sm_util: SM throughput as a fraction of peak, in [0, 1].
        dram_util: DRAM throughput as a fraction of peak bandwidth, in [0, 1].
        tensor_util: tensor-pipe utilisation fraction in [0, 1], or None when not measured.
        clock_mhz: SM clock the kernel actually ran at (MHz), or None when not measured.
        source: where the numbers came from, e.g. ``"ncu:ncu_gpt3xl_1layer.csv.gz"`` or ``"synthetic"``.
    """

    sm_util: float
    dram_util: float
    tensor_util: float | None
    clock_mhz: float | None
    source: str

    def __post_init__(self) -> None:
        for label, value in (("sm_util", self.sm_util), ("dram_util", self.dram_util),
                             ("tensor_util", self.tensor_util)):
            if value is not None and not (0.0 <= value <= 1.0):
                raise TraceFormatError(f"{label}={value} is outside [0, 1]; utilisations are fractions")
        _check_clock("clock_mhz", self.clock_mhz)


@dataclass(frozen=True)
class OpInfo:
    """The framework op that launched a kernel, with its input shapes and dtypes (for FLOP/byte estimates)."""

    name: str
    input_dims: tuple[tuple[int, ...], ...] = ()
    input_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not all(_is_count(v, MAX_TENSOR_DIM) for dims in self.input_dims for v in dims):
            raise TraceFormatError(f"op {self.name[:60]!r}: input dims {self.input_dims!r:.80} are not sizes in "
                                   f"[0, {MAX_TENSOR_DIM}]")


@dataclass(frozen=True)
class Kernel:
    """One GPU activity of a training step.

    Attributes:
        name: the kernel name as the profiler reports it (mangled or demangled).
        kind: kernel, memset or memcpy.
        category: what it does (see :class:`Category`).
        phase: forward, backward, optimizer or other.
        duration_s: time on the GPU (seconds), > 0.
        gap_before_s: idle time between the previous activity's end and this one's start (seconds), >= 0.
        grid: launch grid (x, y, z); (0, 0, 0) for memsets and memcpys.
        block: thread block (x, y, z); (0, 0, 0) for memsets and memcpys.
        op: the launching framework op, when known.
        flops: floating-point operations, when known (synthetic traces, shape estimates).
        dram_bytes: DRAM bytes moved, when known (memsets/memcpys, synthetic traces, shape estimates).
        features: hardware counters at the reference clocks, when measured or generated.
    """

    name: str
    kind: Kind
    category: Category
    phase: Phase
    duration_s: float
    gap_before_s: float
    grid: Dim3 = (0, 0, 0)
    block: Dim3 = (0, 0, 0)
    op: OpInfo | None = None
    flops: float | None = None
    dram_bytes: float | None = None
    features: Features | None = None

    def __post_init__(self) -> None:
        if not (0 < self.duration_s <= MAX_ACTIVITY_S):
            raise TraceFormatError(f"kernel {self.name[:60]!r}: duration_s={self.duration_s} must be > 0 and at "
                                   f"most {MAX_ACTIVITY_S:g}")
        if not (0 <= self.gap_before_s <= MAX_ACTIVITY_S):
            raise TraceFormatError(f"kernel {self.name[:60]!r}: gap_before_s={self.gap_before_s} must be >= 0 and "
                                   f"at most {MAX_ACTIVITY_S:g}")
        for label, value in (("flops", self.flops), ("dram_bytes", self.dram_bytes)):
            if value is not None and not (0 <= value <= MAX_WORK):
                raise TraceFormatError(f"kernel {self.name[:60]!r}: {label}={value} must be >= 0 and at most "
                                       f"{MAX_WORK:g}")
        if not all(_is_count(v, MAX_LAUNCH_DIM) for v in (*self.grid, *self.block)):
            raise TraceFormatError(f"kernel {self.name[:60]!r}: grid {self.grid} and block {self.block} must be "
                                   f"sizes in [0, {MAX_LAUNCH_DIM}]")


@dataclass(frozen=True)
class TraceMeta:
    """Where a trace comes from and the conditions it was recorded under.

    Attributes:
        gpu: GPU model name as reported by the device (e.g. ``"NVIDIA H200"``).
        workload: short workload label (e.g. ``"gpt3xl-24layer-b4"``).
        source: what the trace was made from (file name, generator and its arguments).
        ref_mem_mhz: memory clock during recording (MHz), or None when unknown.
        ref_core_mhz: locked SM clock during recording (MHz), or None when the GPU ran at its own
            default DVFS ("auto").
        observed_core_mhz: median SM clock observed during recording (MHz), when known.
        step_index: which step of the recording this is (0-based), or None for generated traces.
        measurements: whole-step measurements, e.g. ``{"energy_j_per_step": 109.9, "step_time_s": 0.159}``.
        step_shape: the shape of this step's model inputs (:mod:`kdvfs.envs.trace.shape`), when the capture
            knew it; None for imported and generated traces without one.
        shape_distribution: the shapes the recorded run's steps had and how many steps had each, most frequent
            first (empty when unknown); a capture of a run whose steps vary records it in each of its traces.
        power_limit_w: the power limit the GPU enforced while recording (W, NVML), or None when unknown
            (then the GPU profile's default limit stands in).
        power_limit_range_w: ``(low, high)`` the board's settable power-limit range (W, NVML), or None when
            unknown; when both are known, ``low <= power_limit_w <= high``.
    """

    gpu: str
    workload: str
    source: str
    ref_mem_mhz: float | None = None
    ref_core_mhz: float | None = None
    observed_core_mhz: float | None = None
    step_index: int | None = None
    measurements: Mapping[str, float] = field(default_factory=dict)
    step_shape: StepShape | None = None
    shape_distribution: tuple[tuple[StepShape, int], ...] = ()
    power_limit_w: float | None = None
    power_limit_range_w: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        for label in ("ref_mem_mhz", "ref_core_mhz", "observed_core_mhz"):
            _check_clock(label, getattr(self, label))
        if any(steps < 0 for _, steps in self.shape_distribution):
            raise TraceFormatError("shape_distribution step counts must be non-negative")
        object.__setattr__(self, "measurements", frozen(self.measurements))
        _check_power_limits(self.power_limit_w, self.power_limit_range_w)
        if self.power_limit_range_w is not None:
            object.__setattr__(self, "power_limit_range_w", tuple(self.power_limit_range_w))


def _check_power_limits(limit_w: float | None, range_w: tuple[float, float] | None) -> None:
    """Power limits within :data:`POWER_RANGE_W`; the range ``[low, high]`` holding the limit."""
    low, high = POWER_RANGE_W
    given = {"power_limit_w": [] if limit_w is None else [limit_w], "power_limit_range_w": list(range_w or ())}
    for label, values in given.items():
        if not all(low <= value <= high for value in values):
            raise TraceFormatError(f"{label}={values} W is outside [{low:g}, {high:g}] W")
    if range_w is not None and (len(range_w) != 2 or range_w[0] > range_w[1]
                                or (limit_w is not None and not range_w[0] <= limit_w <= range_w[1])):
        raise TraceFormatError(f"power_limit_range_w={list(range_w)} W must be [low, high] holding "
                               f"power_limit_w={limit_w} W")


def _readonly(values: list[float] | list[bool] | list[int], dtype: type) -> np.ndarray:
    array: np.ndarray = np.asarray(values, dtype=dtype)
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class Trace:
    """One training step: its kernels in launch order and its metadata. Immutable.

    Numeric columns (read-only numpy arrays, shape ``(n_kernels,)``): :attr:`duration_s`,
    :attr:`gap_before_s`, :attr:`sm_util`, :attr:`dram_util`, :attr:`tensor_util` (NaN where a
    kernel has no features) and :attr:`has_features`.
    """

    meta: TraceMeta
    kernels: tuple[Kernel, ...]

    def __post_init__(self) -> None:
        if not self.kernels:
            raise TraceFormatError(f"trace {self.meta.workload!r} has no kernels")
        object.__setattr__(self, "kernels", tuple(self.kernels))

    def __len__(self) -> int:
        return len(self.kernels)

    @cached_property
    def duration_s(self) -> np.ndarray:
        return _readonly([k.duration_s for k in self.kernels], np.float64)

    @cached_property
    def gap_before_s(self) -> np.ndarray:
        return _readonly([k.gap_before_s for k in self.kernels], np.float64)

    @cached_property
    def has_features(self) -> np.ndarray:
        return _readonly([k.features is not None for k in self.kernels], np.bool_)

    @cached_property
    def sm_util(self) -> np.ndarray:
        return _readonly([k.features.sm_util if k.features else math.nan for k in self.kernels], np.float64)

    @cached_property
    def dram_util(self) -> np.ndarray:
        return _readonly([k.features.dram_util if k.features else math.nan for k in self.kernels], np.float64)

    @cached_property
    def tensor_util(self) -> np.ndarray:
        values = [k.features.tensor_util if k.features and k.features.tensor_util is not None else math.nan
                  for k in self.kernels]
        return _readonly(values, np.float64)

    @property
    def busy_s(self) -> float:
        """Total kernel time of the step (seconds)."""
        return float(self.duration_s.sum())

    @property
    def step_time_s(self) -> float:
        """Wall time of the step on the GPU: kernels plus the idle gaps between them (seconds)."""
        return float(self.duration_s.sum() + self.gap_before_s.sum())

    @property
    def communication_s(self) -> float:
        """Time in communication kernels (NCCL collectives; gloo ops in CPU test mode), seconds: on a rank
        that waits for a slower one, mostly waiting."""
        return float(sum(k.duration_s for k in self.kernels if k.category is Category.COMMUNICATION))

    def count(self, kind: Kind) -> int:
        """Number of activities of one kind in the step."""
        return sum(1 for k in self.kernels if k.kind is kind)


def with_measured_gaps(trace: Trace) -> Trace:
    """The trace with its idle gaps set so the step lasts the measured, unprofiled step time.

    Profiler overhead slows the CPU's kernel launches and inflates the GPU's idle gaps; when the metadata
    holds ``measurements["step_time_s"]`` shorter than the traced step, the gaps shrink in proportion
    (to zero at most). When it is longer, the difference is the host's work between steps (the data, the
    optimizer's Python), which the measured interval between step ends holds and the trace, from its first kernel
    to its last, does not: it goes before the first kernel, as idle. Otherwise the trace is returned unchanged.
    """
    measured = trace.meta.measurements.get("step_time_s")
    if measured is None or not len(trace.kernels) or measured == trace.step_time_s:
        return trace
    if measured > trace.step_time_s:
        first = trace.kernels[0]
        leading = replace(first, gap_before_s=first.gap_before_s + measured - trace.step_time_s)
        return Trace(trace.meta, (leading, *trace.kernels[1:]))
    idle_s = float(trace.gap_before_s.sum())
    if idle_s <= 0:
        return trace
    scale = max(0.0, measured - trace.busy_s) / idle_s
    return Trace(trace.meta, tuple(replace(k, gap_before_s=k.gap_before_s * scale) for k in trace.kernels))


def noncommunication_s(trace: Trace) -> float:
    """The step's time outside communication kernels (s; idle gaps as in :func:`with_measured_gaps`): what a
    torchrun rank computes and launches between its collectives, its waits left out."""
    return with_measured_gaps(trace).step_time_s - trace.communication_s
