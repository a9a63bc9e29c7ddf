"""The DVFS cost model: time, power and energy of a kernel at any (core, memory) clock pair.

Every number kdvfs reports is scored by this one model; its equations, constants and their sources are in
``docs/design/cost-model.md``. All functions are vectorised: per-kernel arrays have shape ``(K,)`` and
broadcast against clock arrays, e.g. ``(K, 1)`` against ``(N,)`` gives ``(K, N)`` tables. Clocks in MHz,
times in seconds, power in watts, energy in joules.

Time: a kernel measured at reference clocks for ``t0`` seconds scales by a smooth roofline of its compute,
memory and latency demands (``t = t0`` at the reference clocks). Power: static, leakage, core dynamic power
``v^2 f_c`` times the kernel's activity (or its measured power at the reference clocks), and memory
background and traffic power. Communication kernels are clock-free in time. Auto mode: the firmware's power
limiter, per ``power_window_s`` window, picks the highest core clock up to ``boost_limit_fraction * F_c``
whose average power fits the cap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.envs.gpu.profiles import GpuProfile

BISECTION_STEPS = 40


@dataclass(frozen=True)
class CostParams:
    """Cost-model parameters of one GPU (names are the keys of a profile's ``cost_model`` section).

    Attributes:
        fixed_fraction: phi_0, share of a kernel's time that no clock changes (launch overhead).
        boundness_exponent: p, sharpness of the smooth roofline (p-norm of compute, memory, latency).
        latency_floor: eps, latency-bound demand (scales with the core clock) below which utilisations vanish.
        memory_core_knee: kappa, core clock (fraction of max) below which memory traffic slows.
        static_w: static power independent of clocks (W).
        leakage_w: leakage power at maximum voltage, scaling with v (W).
        core_idle_w: core dynamic power at max clock and voltage with idle SMs (W).
        core_sm_w: additional core dynamic power at full SM throughput (W).
        core_tensor_w: additional core dynamic power at full tensor-pipe utilisation (W).
        voltage_min: v at and below the knee, relative to the voltage at the max core clock.
        voltage_knee_fraction: core clock (fraction of max) above which voltage rises.
        mem_background_w: memory power at the max memory clock with no traffic (W).
        mem_background_exponent: q, memory background power scales as (f_m / F_m)^q (1: linear in the clock;
            more where the memory voltage falls with its clock).
        mem_traffic_w: additional power of moving data at full DRAM bandwidth (W).
        traffic_core_share: share of that data-movement power spent in the core voltage domain (L2,
            crossbar, load/store units), which scales with v^2; the rest is in the DRAM and its interface.
        switch_stall_s: time the GPU stalls when a clock change takes effect (s).
        power_window_s: averaging window of the firmware's power limiter (s): in auto mode the core
            clock of a window of kernels is the highest whose average power over the window fits the cap.
        boost_limit_fraction: highest core clock (fraction of max) the firmware boosts to in auto mode under
            load; a locked clock above it runs at the auto clock (a locked clock is an upper bound).
    """

    fixed_fraction: float
    boundness_exponent: float
    latency_floor: float
    memory_core_knee: float
    static_w: float
    leakage_w: float
    core_idle_w: float
    core_sm_w: float
    core_tensor_w: float
    voltage_min: float
    voltage_knee_fraction: float
    mem_background_w: float
    mem_background_exponent: float
    mem_traffic_w: float
    traffic_core_share: float
    switch_stall_s: float
    power_window_s: float
    boost_limit_fraction: float

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_profile(cls, profile: GpuProfile) -> CostParams:
        """Read every parameter from the profile; raises ``UncalibratedError`` for placeholders."""
        return cls(**{name: profile.cost_param(name) for name in cls.names()})

    def as_array(self) -> Array:
        return np.array([getattr(self, name) for name in self.names()], dtype=np.float64)

    @classmethod
    def from_array(cls, values: Array) -> CostParams:
        return cls(**dict(zip(cls.names(), (float(v) for v in values), strict=True)))


@dataclass(frozen=True)
class KernelInputs:
    """What the model needs of each kernel, as arrays of shape ``(K,)``.

    Attributes:
        time_s: duration at the reference clocks (s).
        core_mhz: reference core clock (MHz).
        mem_mhz: reference memory clock (MHz).
        sm_util, dram_util, tensor_util: utilisation fractions at the reference clocks.
        power_w: measured average power at the reference clocks (W), NaN where unknown.
        clock_free: True where the duration does not depend on the clocks (communication kernels: the
            interconnect and the slowest rank set it), None for none.
    """

    time_s: Array
    core_mhz: Array
    mem_mhz: Array
    sm_util: Array
    dram_util: Array
    tensor_util: Array
    power_w: Array
    clock_free: Array | None = None

    def column(self) -> KernelInputs:
        """The same inputs reshaped to ``(K, 1)`` to broadcast against clock rows."""
        free = None if self.clock_free is None else self.clock_free[:, None]
        return KernelInputs(self.time_s[:, None], self.core_mhz[:, None], self.mem_mhz[:, None],
                            self.sm_util[:, None], self.dram_util[:, None], self.tensor_util[:, None],
                            self.power_w[:, None], free)

    def clock_free_mask(self) -> Array:
        """:attr:`clock_free` as a boolean array (all False when None)."""
        return np.zeros_like(self.time_s, dtype=bool) if self.clock_free is None else self.clock_free


@dataclass(frozen=True)
class ClockLimits:
    """The maximum core and memory clocks (MHz) the model normalises by."""

    max_core_mhz: float
    max_mem_mhz: float

    @classmethod
    def of(cls, profile: GpuProfile) -> ClockLimits:
        return cls(float(profile.clocks.max_core_mhz), float(max(profile.clocks.memory_mhz)))


def slowdown(params: CostParams, limits: ClockLimits, k: KernelInputs, core_mhz: Array, mem_mhz: Array) -> Array:
    """S(f_c, f_m): each kernel's time relative to its ideal at the max clocks (dimensionless, broadcasts)."""
    p = params.boundness_exponent
    core_ratio = limits.max_core_mhz / core_mhz
    memory_ratio = np.maximum(limits.max_mem_mhz / mem_mhz, params.memory_core_knee * core_ratio)
    compute = np.power(np.clip(k.sm_util, 0.0, 1.0) * core_ratio, p)
    memory = np.power(np.clip(k.dram_util, 0.0, 1.0) * memory_ratio, p)
    latency = np.power(params.latency_floor * core_ratio, p)
    return params.fixed_fraction + (1.0 - params.fixed_fraction) * np.power(compute + memory + latency, 1.0 / p)


def kernel_time_s(params: CostParams, limits: ClockLimits, k: KernelInputs, core_mhz: Array, mem_mhz: Array) -> Array:
    """Duration (s) of each kernel at the given clocks (broadcast of ``k`` arrays with the clocks); a
    clock-free kernel keeps its measured duration."""
    reference = slowdown(params, limits, k, k.core_mhz, k.mem_mhz)
    scaled = k.time_s * slowdown(params, limits, k, core_mhz, mem_mhz) / reference
    return np.where(k.clock_free_mask(), k.time_s, scaled)


def voltage(params: CostParams, limits: ClockLimits, core_mhz: Array) -> Array:
    """v(f): core voltage relative to the voltage at the max core clock."""
    knee = params.voltage_knee_fraction * limits.max_core_mhz
    rise = np.clip((core_mhz - knee) / max(limits.max_core_mhz - knee, 1e-9), 0.0, 1.0)
    return params.voltage_min + (1.0 - params.voltage_min) * rise


def idle_power_w(params: CostParams, limits: ClockLimits, core_mhz: Array, mem_mhz: Array) -> Array:
    """Power (W) of the GPU holding the given clocks with no kernel running (idle gaps)."""
    v = voltage(params, limits, core_mhz)
    return (params.static_w + params.leakage_w * v + v * v * (core_mhz / limits.max_core_mhz) * params.core_idle_w
            + params.mem_background_w * np.power(mem_mhz / limits.max_mem_mhz, params.mem_background_exponent))


def _core_activity_w(params: CostParams, limits: ClockLimits, k: KernelInputs) -> Array:
    """Core dynamic power (W, at max clock and voltage) of each kernel's work at its reference rate.

    From the utilisations, or, where the kernel's power at the reference clocks was measured, the part of
    that measurement the idle and memory terms do not explain. That part may be negative down to minus the
    idle core power: a kernel that occupies few SMs (latency-bound) leaves the others clock-gated.
    """
    from_utilisation = params.core_sm_w * k.sm_util + params.core_tensor_w * k.tensor_util
    v = voltage(params, limits, k.core_mhz)
    unexplained = (k.power_w - idle_power_w(params, limits, k.core_mhz, k.mem_mhz)
                   - _traffic_w(params, v, k.dram_util * k.mem_mhz / limits.max_mem_mhz))
    from_measurement = np.maximum(unexplained / (v * v * k.core_mhz / limits.max_core_mhz), -params.core_idle_w)
    return np.where(np.isfinite(k.power_w), from_measurement, from_utilisation)


def kernel_power_w(params: CostParams, limits: ClockLimits, k: KernelInputs, core_mhz: Array, mem_mhz: Array,
                   time_s: Array) -> Array:
    """Average power (W) of each kernel at the given clocks, given its duration there.

    A clock-free kernel's core activity is per cycle (SMs polling for the other ranks' data do the same work
    each cycle at any clock), so its core power scales as v^2 f like the idle core's.
    """
    stretch = k.time_s / time_s
    core_work = np.where(k.clock_free_mask(), 1.0, stretch * k.core_mhz / core_mhz)
    dram_rate = k.dram_util * (k.mem_mhz / limits.max_mem_mhz) * stretch
    v = voltage(params, limits, core_mhz)
    active = v * v * (core_mhz / limits.max_core_mhz) * _core_activity_w(params, limits, k) * core_work
    return idle_power_w(params, limits, core_mhz, mem_mhz) + active + _traffic_w(params, v, dram_rate)


def _traffic_w(params: CostParams, v: Array, dram_rate: Array) -> Array:
    """Data-movement power (W) at a DRAM traffic rate (fraction of peak bandwidth) and core voltage v."""
    share = params.traffic_core_share
    return params.mem_traffic_w * dram_rate * ((1.0 - share) + share * v * v)


def self_referenced_power_w(params: CostParams, limits: ClockLimits, k: KernelInputs, core_mhz: Array) -> Array:
    """Power (W) of kernels whose utilisations were measured at ``core_mhz`` itself (broadcasts)."""
    same = KernelInputs(k.time_s, core_mhz, k.mem_mhz, k.sm_util, k.dram_util, k.tensor_util, k.power_w, k.clock_free)
    return kernel_power_w(params, limits, same, core_mhz, k.mem_mhz, k.time_s)


def auto_clock_range_mhz(params: CostParams, limits: ClockLimits, core_mhz: Array) -> tuple[float, float]:
    """Lowest and highest core clock (MHz) auto mode may run at among the supported ``core_mhz``: up to the
    boost limit, never below the lowest supported clock."""
    low, high = float(np.min(core_mhz)), float(np.max(core_mhz))
    return low, max(low, min(high, params.boost_limit_fraction * limits.max_core_mhz))


def power_windows(start_s: Array, window_s: float) -> Array:
    """(K,) index of the power-limiter window each kernel starts in (0, 1, ... in time order)."""
    raw = np.floor(start_s / max(window_s, 1e-12)).astype(np.int64)
    return np.unique(raw, return_inverse=True)[1]


EnergyAt = Callable[[Array], tuple[Array, Array]]
"""Per-kernel (energy J, duration s) with each kernel at the given clock (K,), its preceding gap included."""


def windowed_capped_clock_mhz(energy_at: EnergyAt, window: Array, clock_range_mhz: tuple[float, float],
                              cap_w: float) -> Array:
    """Per-kernel auto core clock (K,): in each window the highest clock within ``clock_range_mhz`` whose
    average power over the window fits the cap, or the lowest where none does.

    The clock is continuous: a capped GPU dithers between adjacent clock bins, so over a window it averages
    the clock at which power meets the cap. Found by bisection (average power rises with the clock);
    ``window`` is the sorted window index of each kernel.
    """
    starts = np.flatnonzero(np.r_[True, window[1:] != window[:-1]])

    def fits(clock_mhz: Array) -> Array:
        energy, duration = energy_at(clock_mhz[window])
        return np.add.reduceat(energy, starts) / np.add.reduceat(duration, starts) <= cap_w

    low = np.full(len(starts), clock_range_mhz[0])
    high = np.full(len(starts), clock_range_mhz[1])
    at_top = fits(high)
    for _ in range(BISECTION_STEPS):
        middle = 0.5 * (low + high)
        ok = fits(middle)
        low, high = np.where(ok, middle, low), np.where(ok, high, middle)
    return np.where(at_top, clock_range_mhz[1], low)[window]
