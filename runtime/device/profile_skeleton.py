"""A GPU profile skeleton for an installed GPU (``kdvfs gpus local --write``).

Clock tables, power limits and, when the GPU is idle, idle power come from NVML. What NVML cannot tell
(architecture, roofline, switching latency, idle power of a busy GPU, sometimes the SM count) is copied
from a reference profile (:func:`reference_profile`), and the profile's ``sources`` say which is which.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kdvfs.common.config import to_plain
from kdvfs.common.errors import UnknownGpuError
from kdvfs.envs.gpu.profile_io import write_profile_yaml
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile, profile_for_nvml_name
from kdvfs.runtime.device.nvml_device import LocalGpu

DEFAULT_REFERENCE = "h200"
_HEADER = "# GPU profile skeleton written by `kdvfs gpus local --write`; `sources` says what is measured.\n"


def reference_profile(nvml_name: str) -> GpuProfile:
    """The shipped profile whose ``nvml_names`` list ``nvml_name``; for a GPU no shipped profile lists (the one
    a skeleton is for), :data:`DEFAULT_REFERENCE`. Its copied facts are named as such in the skeleton's sources."""
    try:
        return profile_for_nvml_name(nvml_name)
    except UnknownGpuError:
        return load_profile(DEFAULT_REFERENCE)


def compress_clocks_mhz(clocks_mhz: Sequence[int]) -> list[int] | dict[str, int]:
    """``{min_mhz, max_mhz, step_mhz}`` when three or more clocks form exactly an arithmetic progression,
    else the list itself."""
    values = list(clocks_mhz)
    steps = {b - a for a, b in itertools.pairwise(values)}
    if len(values) >= 3 and len(steps) == 1 and min(steps) > 0:
        return {"min_mhz": values[0], "max_mhz": values[-1], "step_mhz": steps.pop()}
    return values


def _clocks(gpu: LocalGpu) -> dict[str, Any]:
    default_cores = gpu.core_clocks_mhz[gpu.default_memory_mhz]
    return {
        "memory_mhz": list(gpu.memory_clocks_mhz),
        "core_mhz": {mem: compress_clocks_mhz(gpu.core_clocks_mhz[mem]) for mem in gpu.memory_clocks_mhz},
        "default_memory_mhz": gpu.default_memory_mhz,
        "max_core_mhz": max(default_cores),
        "idle_core_mhz": min(default_cores),
    }


def _sources(gpu: LocalGpu, reference: GpuProfile) -> list[str]:
    measured = ["clocks", "power limit and range"]
    copied = ["architecture", "peak FLOP/s", "DRAM bandwidth"]
    (measured if gpu.is_idle else copied).append("idle power")
    (measured if gpu.sm_count is not None else copied).append("SM count")
    copied.append("switching latency")
    sources = [f"{', '.join(measured)}: NVML on GPU {gpu.index} ({gpu.name}, driver {gpu.driver_version}), "
               "read by `kdvfs gpus local`",
               f"{', '.join(copied)}: copied from the shipped profile {reference.name} "
               f"({reference.model}); not measured on this GPU, check them"]
    listed_max_mhz = max(gpu.core_clocks_mhz[gpu.default_memory_mhz])
    if listed_max_mhz != gpu.max_core_mhz:
        sources.append(f"NVML's maximum core clock {gpu.max_core_mhz} MHz differs from the highest supported "
                       f"clock {listed_max_mhz} MHz; max_core_mhz uses the supported list")
    return sources


def skeleton_profile(gpu: LocalGpu, name: str) -> dict[str, Any]:
    """A plain mapping in the schema of ``configs/gpus/*.yaml`` for ``gpu``, named ``name``."""
    reference = reference_profile(gpu.name)
    roofline = to_plain(reference.roofline)
    if gpu.sm_count is not None:
        roofline["sm_count"] = gpu.sm_count
    return {
        "name": name,
        "model": gpu.name,
        "nvml_names": [gpu.name],
        "architecture": reference.architecture,
        "sources": _sources(gpu, reference),
        "clocks": _clocks(gpu),
        "power": {
            "limit_w": gpu.power_limit_w,
            "limit_range_w": list(gpu.power_limit_range_w),
            "idle_w": gpu.power_draw_w if gpu.is_idle else reference.power.idle_w,
        },
        "roofline": roofline,
        "switching": {
            "latency_mean_s": reference.switching.latency_mean_s,
            "latency_std_s": reference.switching.latency_std_s,
            "source": f"copied from the shipped profile {reference.name}, not measured on this GPU: "
                      f"{reference.switching.source}",
            "estimated": True,
        },
        "cost_model": {},
    }


def write_skeleton_yaml(mapping: Mapping[str, Any], path: Path | str) -> GpuProfile:
    """Write a skeleton profile (validated, atomically) with a header saying where it came from."""
    return write_profile_yaml(mapping, path, _HEADER)
