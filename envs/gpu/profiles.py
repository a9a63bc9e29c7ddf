"""GPU profiles: the clocks, power limits, roofline and switching latency of one GPU model.

Profiles live in ``configs/gpus/<name>.yaml`` (schema in ``docs/design/gpu-profiles.md``) and load into the
frozen :class:`GpuProfile`. Core clocks per memory clock are either an explicit list of MHz values or a
range ``{min_mhz, max_mhz, step_mhz}``. Cost-model parameters carry a status; a placeholder is never
handed out silently (:meth:`GpuProfile.cost_param` raises :class:`~kdvfs.common.errors.UncalibratedError`).
An installed GPU's profile is the shipped one whose ``nvml_names`` list its NVML device name
(:func:`profile_for_nvml_name`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from kdvfs.common.config import ConfigError, from_mapping, load_yaml
from kdvfs.common.errors import ProfileError, UncalibratedError, UnknownGpuError
from kdvfs.common.paths import GPU_PROFILE_DIR
from kdvfs.common.resolve import resolve_shipped, shipped_names

PARAM_STATUSES = ("placeholder", "estimate", "calibrated")
_FRACTION = (0.0, 1.0)
_WATTS = (0.0, math.inf)
COST_PARAM_RANGES: Mapping[str, tuple[float, float]] = MappingProxyType({
    "fixed_fraction": _FRACTION, "boundness_exponent": (0.5, 64.0), "latency_floor": _FRACTION,
    "memory_core_knee": _FRACTION, "static_w": _WATTS, "leakage_w": _WATTS, "core_idle_w": _WATTS,
    "core_sm_w": _WATTS, "core_tensor_w": _WATTS, "voltage_min": _FRACTION, "voltage_knee_fraction": _FRACTION,
    "mem_background_w": _WATTS, "mem_traffic_w": _WATTS, "traffic_core_share": _FRACTION,
    "switch_stall_s": (0.0, 1.0), "power_window_s": (1e-9, 10.0), "boost_limit_fraction": _FRACTION,
})
"""Where each cost-model parameter makes sense, inclusive (meanings: ``kdvfs.envs.model.cost_model.CostParams``)."""


class ProfileConfigError(ProfileError, ConfigError):
    """A GPU profile file that does not match its schema or holds a value out of range."""


@dataclass(frozen=True)
class Clocks:
    """Supported clocks (MHz). ``memory_mhz`` descending; each ``core_mhz`` list strictly ascending."""

    memory_mhz: tuple[int, ...]
    core_mhz: Mapping[int, tuple[int, ...]]
    default_memory_mhz: int
    max_core_mhz: int
    idle_core_mhz: int

    def __post_init__(self) -> None:
        if not self.memory_mhz or list(self.memory_mhz) != sorted(set(self.memory_mhz), reverse=True):
            raise ProfileError(f"memory_mhz {list(self.memory_mhz)} must be distinct and in descending order")
        if set(self.core_mhz) != set(self.memory_mhz):
            raise ProfileError(f"core_mhz has entries for {sorted(self.core_mhz)} but memory_mhz lists "
                               f"{sorted(self.memory_mhz)}; give the core clocks of every memory clock")
        for mem, cores in self.core_mhz.items():
            if not cores or list(cores) != sorted(set(cores)) or cores[0] <= 0:
                raise ProfileError(f"core_mhz[{mem}] must be positive, distinct and in ascending order")
        if self.default_memory_mhz not in self.memory_mhz:
            raise ProfileError(f"default_memory_mhz {self.default_memory_mhz} is not in memory_mhz")
        if self.max_core_mhz != max(self.core_mhz[self.default_memory_mhz]):
            raise ProfileError(f"max_core_mhz {self.max_core_mhz} differs from the highest core clock "
                               f"{max(self.core_mhz[self.default_memory_mhz])} at the default memory clock")


@dataclass(frozen=True)
class Power:
    """Power facts (W): enforced limit, settable limit range, idle draw."""

    limit_w: float
    limit_range_w: tuple[float, float]
    idle_w: float

    def __post_init__(self) -> None:
        low, high = self.limit_range_w
        if not 0 < low <= self.limit_w <= high:
            raise ProfileError(f"limit_w {self.limit_w} must lie in limit_range_w {list(self.limit_range_w)}")
        if not 0 < self.idle_w < self.limit_w:
            raise ProfileError(f"idle_w {self.idle_w} must be positive and below limit_w {self.limit_w}")


@dataclass(frozen=True)
class Roofline:
    """Peak dense throughput by precision (FLOP/s), DRAM bandwidth (bytes/s) and SM count."""

    peak_flops: Mapping[str, float]
    dram_bandwidth_bytes_per_s: float
    sm_count: int

    def __post_init__(self) -> None:
        if not self.peak_flops or min(self.peak_flops.values()) <= 0 or self.dram_bandwidth_bytes_per_s <= 0:
            raise ProfileError("peak_flops and dram_bandwidth_bytes_per_s must be positive")
        if self.sm_count <= 0:
            raise ProfileError(f"sm_count {self.sm_count} must be positive")


@dataclass(frozen=True)
class Switching:
    """Latency from an NVML clock request to the new clock taking effect (seconds).

    ``latency_range_s`` is the plausible range of the mean latency (sampled for a figure's range);
    without one, the mean plus or minus two standard deviations is used.
    """

    latency_mean_s: float
    latency_std_s: float
    source: str
    estimated: bool
    latency_range_s: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.latency_mean_s < 0 or self.latency_std_s < 0:
            raise ProfileError("latency_mean_s and latency_std_s must be >= 0")
        if self.latency_range_s is not None:
            _check_range(self.latency_range_s, self.latency_mean_s, "latency_range_s")

    @property
    def plausible_latency_s(self) -> tuple[float, float]:
        """The latency range: ``latency_range_s``, else the mean +- 2 standard deviations (not below 0)."""
        if self.latency_range_s is not None:
            return self.latency_range_s
        return max(0.0, self.latency_mean_s - 2 * self.latency_std_s), self.latency_mean_s + 2 * self.latency_std_s


def _check_range(bounds: tuple[float, float], value: float, label: str) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise ProfileError(f"{label} {list(bounds)} must be [low, high] with low <= {value:g} <= high")


@dataclass(frozen=True)
class CostParam:
    """One cost-model parameter with its provenance.

    ``range`` is its plausible ``[low, high]`` (required for an ``estimate``), ``range_source`` where that
    range comes from; a figure's range samples every parameter that has one (:mod:`kdvfs.envs.model.ranges`).
    ``transferred_from`` names the GPU profile an estimate was copied or scaled from (``"h200"``): its range
    describes that GPU, so the sample widens it (``kdvfs.envs.model.uncertainty``).
    """

    value: float
    status: str
    source: str
    range: tuple[float, float] | None = None
    range_source: str | None = None
    transferred_from: str | None = None

    def __post_init__(self) -> None:
        if self.status not in PARAM_STATUSES:
            raise ProfileError(f"status {self.status!r} must be one of {list(PARAM_STATUSES)}")
        if self.status == "estimate" and self.range is None:
            raise ProfileError("an estimate needs its plausible range: add range: [low, high] and range_source")
        if (self.range is None) != (self.range_source is None):
            raise ProfileError("range and range_source go together: give both or neither")
        if self.range is not None:
            _check_range(self.range, self.value, "range")
        if self.transferred_from is not None and self.status != "estimate":
            raise ProfileError("transferred_from marks an estimate: set status: estimate or drop transferred_from")

    def as_mapping(self) -> dict[str, Any]:
        """The parameter as it is written in a profile's ``cost_model`` section."""
        extra: dict[str, Any] = {} if self.range is None else {"range": list(self.range),
                                                                 "range_source": self.range_source}
        if self.transferred_from is not None:
            extra["transferred_from"] = self.transferred_from
        return {"value": self.value, "status": self.status, "source": self.source, **extra}


@dataclass(frozen=True)
class GpuProfile:
    """Everything kdvfs knows about one GPU model. Load with :func:`load_profile`."""

    name: str
    model: str
    nvml_names: tuple[str, ...]
    architecture: str
    sources: tuple[str, ...]
    clocks: Clocks
    power: Power
    roofline: Roofline
    switching: Switching
    cost_model: Mapping[str, CostParam] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, param in self.cost_model.items():
            low, high = COST_PARAM_RANGES.get(name, (-math.inf, math.inf))
            if not low <= param.value <= high:
                raise ProfileError(f"cost_model.{name}.value {param.value:g} is outside [{low:g}, {high:g}]")
        folded = [name.casefold() for name in self.nvml_names]
        if not folded or not all(name.strip() for name in folded) or len(set(folded)) != len(folded):
            raise ProfileError(f"nvml_names {list(self.nvml_names)} must list one or more distinct NVML device names "
                               "(as `kdvfs gpus local` prints them)")

    def applies_to(self, nvml_name: str) -> bool:
        """True when ``nvml_name`` (an NVML device name, case-insensitive) is one of :attr:`nvml_names`."""
        return nvml_name.casefold() in (name.casefold() for name in self.nvml_names)

    @cached_property
    def clock_pairs_mhz(self) -> np.ndarray:
        """Every supported (core, memory) pair, shape ``(n_pairs, 2)``, memory descending then core ascending."""
        pairs = [(core, mem) for mem in self.clocks.memory_mhz for core in self.clocks.core_mhz[mem]]
        array: np.ndarray = np.asarray(pairs, dtype=np.float64)
        array.flags.writeable = False
        return array

    def cost_param(self, name: str) -> float:
        """A cost-model parameter's value; raises if it is missing or still a placeholder."""
        param = self.cost_model.get(name)
        if param is None or param.status == "placeholder":
            raise UncalibratedError(f"GPU profile {self.name!r}: cost-model parameter {name!r} is "
                                    f"{'missing' if param is None else 'a placeholder'}; calibrate it with "
                                    "`kdvfs model fit`")
        return param.value


def _expand_core_clocks(raw: Any, where: str) -> Any:
    """Turn ``{min_mhz, max_mhz, step_mhz}`` ranges under clocks.core_mhz into explicit lists."""
    core = raw.get("clocks", {}).get("core_mhz") if isinstance(raw, dict) and isinstance(raw.get("clocks"), dict) \
        else None
    if not isinstance(core, dict):
        return raw
    expanded = {}
    for mem, spec in core.items():
        if isinstance(spec, dict):
            if set(spec) != {"min_mhz", "max_mhz", "step_mhz"}:
                raise ConfigError(f"{where}: clocks.core_mhz.{mem}: a range needs exactly min_mhz, max_mhz, step_mhz")
            low, high, step = spec["min_mhz"], spec["max_mhz"], spec["step_mhz"]
            if not (isinstance(step, int) and step > 0 and isinstance(low, int) and isinstance(high, int)
                    and low <= high):
                raise ConfigError(f"{where}: clocks.core_mhz.{mem}: need integers min_mhz <= max_mhz, step_mhz > 0")
            expanded[mem] = list(range(low, high + 1, step))
        else:
            expanded[mem] = spec
    return {**raw, "clocks": {**raw["clocks"], "core_mhz": expanded}}


def available_profiles() -> list[str]:
    """Names of the profiles shipped in ``configs/gpus``."""
    return shipped_names(GPU_PROFILE_DIR, ".yaml")


def profile_path(name_or_path: str | Path) -> Path:
    """Resolve a profile name (``h200``) or a path to a YAML file."""
    return resolve_shipped(name_or_path, GPU_PROFILE_DIR, ".yaml", "GPU profile", error=ProfileError,
                           name_kind="GPU", hint=" (`kdvfs gpus local --write` makes one for this machine)")


def profile_for_nvml_name(nvml_name: str) -> GpuProfile:
    """The shipped profile whose ``nvml_names`` list ``nvml_name`` (an installed GPU's NVML device name).

    Raises :class:`~kdvfs.common.errors.UnknownGpuError` when no shipped profile lists it.
    """
    matches = [profile for profile in map(load_profile, available_profiles()) if profile.applies_to(nvml_name)]
    if len(matches) > 1:
        raise ProfileError(f"shipped GPU profiles {', '.join(p.name for p in matches)} all list the NVML name "
                           f"{nvml_name!r}; keep it in the nvml_names of one of them")
    if not matches:
        raise UnknownGpuError(f"no shipped GPU profile lists the NVML name {nvml_name!r}; write a profile of this GPU "
                              "with `kdvfs gpus local --write PATH` and pass it as --gpu PATH")
    return matches[0]


def load_profile(name_or_path: str | Path) -> GpuProfile:
    """Load and validate a GPU profile by name or path."""
    path = profile_path(name_or_path)
    try:
        profile = from_mapping(GpuProfile, _expand_core_clocks(load_yaml(path), str(path)), str(path))
    except ConfigError as error:
        raise ProfileConfigError(str(error)) from None
    if profile.name != path.stem and path.parent == GPU_PROFILE_DIR:
        raise ProfileError(f"{path}: name {profile.name!r} must match the file name {path.stem!r}")
    return profile
