"""Cost tables of a trace on a GPU profile: every kernel at every supported clock pair and in auto mode.

This is the form the environment, the planners, the evaluation and the fake device consume. Tables are
computed once per (trace, profile, priced power limit) with numpy broadcasting, no Python loop over kernels.
Two power limits enter (:mod:`kdvfs.envs.model.power_limits`): the one the trace was recorded under decides
the clocks its kernels ran at; the one it is priced at caps auto mode and every locked pair.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.cost_model import (
    Array,
    ClockLimits,
    CostParams,
    KernelInputs,
    auto_clock_range_mhz,
    idle_power_w,
    kernel_power_w,
    kernel_time_s,
    power_windows,
    self_referenced_power_w,
    windowed_capped_clock_mhz,
)
from kdvfs.envs.model.estimate import estimate_features
from kdvfs.envs.model.power_limits import power_limits
from kdvfs.envs.trace.trace import Category, Trace, with_measured_gaps


@dataclass(frozen=True)
class CostTables:
    """Time, power and energy of each kernel of one step, at each clock pair and in auto mode.

    Shapes: K kernels, N supported (core, memory) pairs, M memory clocks.

    Attributes:
        pairs_mhz: (N, 2) the (core, memory) pairs, as ``GpuProfile.clock_pairs_mhz``.
        memory_mhz: (M,) memory clocks, descending (auto-mode columns).
        time_s, power_w, energy_j: (K, N) duration (s), average power (W), energy (J) at each pair.
        auto_core_mhz, auto_time_s, auto_power_w, auto_energy_j: (K, M) the same with the core clock left
            to the firmware (highest within the power cap) at each memory clock.
        gap_s: (K,) idle time before each kernel (s).
        gap_power_w: (N,) idle power at each pair (W); auto_gap_power_w: (K, M) idle power during each
            kernel's preceding gap in auto mode (W).
    """

    pairs_mhz: Array
    memory_mhz: Array
    time_s: Array
    power_w: Array
    energy_j: Array
    auto_core_mhz: Array
    auto_time_s: Array
    auto_power_w: Array
    auto_energy_j: Array
    gap_s: Array
    gap_power_w: Array
    auto_gap_power_w: Array


def kernel_inputs(trace: Trace, profile: GpuProfile, params: CostParams, recorded_limit_w: float | None = None
                  ) -> KernelInputs:
    """Model inputs of a trace's kernels; reference clocks resolved, missing features estimated.

    A trace recorded at locked clocks (``meta.ref_core_mhz``) uses them as the reference; one recorded in
    auto mode gets the clocks the power limiter chose while recording: per window, the highest core clock
    whose average power (each kernel with its own utilisations) fits the cap it was recorded under
    (``recorded_limit_w``; None: the recorded limit of :func:`~kdvfs.envs.model.power_limits.power_limits`).
    A trace recorded at a memory clock this profile lacks (on another GPU) is taken as recorded at the
    profile's default memory clock.
    Communication kernels are clock-free (:class:`~kdvfs.envs.model.cost_model.KernelInputs`).
    """
    if not trace.has_features.all():
        trace = estimate_features(trace, profile)
    count = len(trace)
    known = np.full(count, np.nan)
    recorded_mem = trace.meta.ref_mem_mhz
    reference_mem = profile.clocks.default_memory_mhz
    if recorded_mem is not None and int(recorded_mem) in profile.clocks.memory_mhz:
        reference_mem = int(recorded_mem)
    mem_mhz = np.full(count, float(reference_mem))
    core_mhz = np.full(count, float(trace.meta.ref_core_mhz or profile.clocks.max_core_mhz))
    inputs = KernelInputs(
        time_s=np.asarray(trace.duration_s, dtype=np.float64), core_mhz=core_mhz, mem_mhz=mem_mhz,
        sm_util=np.asarray(trace.sm_util), dram_util=np.asarray(trace.dram_util),
        tensor_util=np.nan_to_num(np.asarray(trace.tensor_util), nan=0.0), power_w=known,
        clock_free=np.array([k.category is Category.COMMUNICATION for k in trace.kernels], dtype=bool),
    )
    if trace.meta.ref_core_mhz is not None:
        return inputs
    cap_w = power_limits(trace, profile).recorded_w if recorded_limit_w is None else recorded_limit_w
    return replace(inputs, core_mhz=auto_reference_mhz(params, profile, inputs, np.asarray(trace.gap_before_s), cap_w))


def _windows(params: CostParams, time_s: Array, gap_s: Array) -> Array:
    """Power-limiter window of each kernel on the timeline of the given times (K,)."""
    start_s = np.cumsum(gap_s + time_s) - time_s
    return power_windows(start_s, params.power_window_s)


def _clock_range(params: CostParams, profile: GpuProfile, mem_mhz: float) -> tuple[float, float]:
    cores = np.asarray(profile.clocks.core_mhz[int(mem_mhz)], dtype=np.float64)
    return auto_clock_range_mhz(params, ClockLimits.of(profile), cores)


def auto_reference_mhz(params: CostParams, profile: GpuProfile, k: KernelInputs, gap_s: Array, cap_w: float
                       ) -> Array:
    """Core clock (MHz) the power limiter picked for kernels recorded in auto mode under ``cap_w`` (W), shape
    ``(K,)``."""
    limits = ClockLimits.of(profile)
    mem = float(k.mem_mhz[0])

    def energy_at(core_mhz: Array) -> tuple[Array, Array]:
        power = self_referenced_power_w(params, limits, k, core_mhz)
        return power * k.time_s + gap_s * idle_power_w(params, limits, core_mhz, k.mem_mhz), k.time_s + gap_s

    return windowed_capped_clock_mhz(energy_at, _windows(params, k.time_s, gap_s), _clock_range(params, profile, mem),
                                     cap_w)


def _auto_column(params: CostParams, profile: GpuProfile, k: KernelInputs, gap_s: Array, mem_mhz: float,
                 cap_w: float) -> tuple[Array, Array, Array, Array]:
    """Auto-mode core clock, time, power and gap power at one memory clock under the cap ``cap_w`` (W), each
    (K,)."""
    limits, mem = ClockLimits.of(profile), np.full(len(gap_s), mem_mhz)

    def costs_at(core_mhz: Array) -> tuple[Array, Array, Array]:
        time = kernel_time_s(params, limits, k, core_mhz, mem)
        return time, kernel_power_w(params, limits, k, core_mhz, mem, time), idle_power_w(params, limits, core_mhz, mem)

    def energy_at(core_mhz: Array) -> tuple[Array, Array]:
        time, power, gap_power = costs_at(core_mhz)
        return power * time + gap_s * gap_power, time + gap_s

    chosen = windowed_capped_clock_mhz(energy_at, _windows(params, k.time_s, gap_s),
                                       _clock_range(params, profile, mem_mhz), cap_w)
    return (chosen, *costs_at(chosen))


def _auto_columns(params: CostParams, profile: GpuProfile, k: KernelInputs, gap_s: Array, cap_w: float
                  ) -> tuple[Array, Array, Array, Array]:
    """Auto-mode core clock, time, power and gap power under the cap ``cap_w`` (W), each (K, M)."""
    columns = [_auto_column(params, profile, k, gap_s, float(mem), cap_w) for mem in profile.clocks.memory_mhz]
    return tuple(np.stack(parts, axis=1) for parts in zip(*columns, strict=True))  # type: ignore[return-value]


def build_tables(trace: Trace, profile: GpuProfile, params: CostParams | None = None,
                 power_limit_w: float | None = None) -> CostTables:
    """Cost tables of ``trace`` on ``profile`` (parameters from the profile unless given), priced at the power
    limit ``power_limit_w`` (W; None: the limit the trace was recorded under, :mod:`~kdvfs.envs.model.power_limits`,
    which raises for a limit outside the board's range).

    The power cap and the boost limit always hold: a locked core clock above the auto clock at that memory
    clock runs at the auto clock (the firmware treats a locked clock as an upper bound).

    Idle gaps are those of the unprofiled step when the trace carries its measured step time
    (:func:`kdvfs.envs.trace.trace.with_measured_gaps`).
    """
    params = params or CostParams.from_profile(profile)
    caps = power_limits(trace, profile, power_limit_w)
    trace = with_measured_gaps(trace)
    limits = ClockLimits.of(profile)
    k = kernel_inputs(trace, profile, params, caps.recorded_w)
    gap_s = np.asarray(trace.gap_before_s, dtype=np.float64)
    pairs = profile.clock_pairs_mhz
    core, mem = pairs[:, 0][None, :], pairs[:, 1][None, :]
    time = kernel_time_s(params, limits, k.column(), core, mem)
    power = kernel_power_w(params, limits, k.column(), core, mem, time)
    auto_core, auto_time, auto_power, auto_gap_power = _auto_columns(params, profile, k, gap_s, caps.priced_w)
    memory_index = np.searchsorted(-np.asarray(profile.clocks.memory_mhz, dtype=np.float64), -pairs[:, 1])
    over_cap = core > auto_core[:, memory_index]
    time = np.where(over_cap, auto_time[:, memory_index], time)
    power = np.where(over_cap, auto_power[:, memory_index], power)
    return CostTables(
        pairs_mhz=pairs, memory_mhz=np.asarray(profile.clocks.memory_mhz, dtype=np.float64),
        time_s=time, power_w=power, energy_j=time * power,
        auto_core_mhz=auto_core, auto_time_s=auto_time, auto_power_w=auto_power,
        auto_energy_j=auto_time * auto_power, gap_s=gap_s,
        gap_power_w=idle_power_w(params, limits, pairs[:, 0], pairs[:, 1]), auto_gap_power_w=auto_gap_power,
    )


AutoStep = Callable[[float], tuple[float, float]]
"""Step time (s) and energy (J) in auto mode at the highest memory clock under a power limit (W)."""


def auto_step_pricer(trace: Trace, profile: GpuProfile, params: CostParams | None = None) -> AutoStep:
    """Price the whole step in auto mode at the highest memory clock (the GPU's default behaviour) under any
    power limit, the trace's kernels as recorded under its recorded limit: what :func:`build_tables` at
    ``power_limit_w`` gives for that column, kernels and idle gaps summed, without the rest of the tables.
    The limit is not checked against the board's range."""
    params = params or CostParams.from_profile(profile)
    trace = with_measured_gaps(trace)
    k = kernel_inputs(trace, profile, params)
    gap_s = np.asarray(trace.gap_before_s, dtype=np.float64)
    top_mhz = float(profile.clocks.memory_mhz[0])

    def price(power_limit_w: float) -> tuple[float, float]:
        _, time_s, power_w, gap_power_w = _auto_column(params, profile, k, gap_s, top_mhz, power_limit_w)
        return float((time_s + gap_s).sum()), float((time_s * power_w + gap_s * gap_power_w).sum())

    return price


def step_breakdown(trace: Trace, tables: CostTables, time_s: Array, energy_j: Array,
                   gap_power_w: Array | float) -> dict[str, Any]:
    """Whole-step time (s), energy (J) and average power (W) for one column of ``tables``, with a
    per-category split of kernel time and energy. ``time_s``, ``energy_j`` and ``gap_power_w`` (the idle
    power during each kernel's preceding gap) broadcast to shape (K,)."""
    step_time_s = float(time_s.sum() + tables.gap_s.sum())
    energy = float(energy_j.sum() + (tables.gap_s * gap_power_w).sum())
    categories = np.array([k.category.value for k in trace.kernels])
    by_category = {}
    for category in dict.fromkeys(categories):
        selected = categories == category
        by_category[str(category)] = {"time_s": float(time_s[selected].sum()),
                                      "energy_j": float(energy_j[selected].sum())}
    return {"step_time_s": step_time_s, "energy_j": energy, "avg_power_w": energy / step_time_s,
            "by_category": by_category}
