"""From calibration measurements to a fitted GPU profile.

The profile starts as the installed GPU's skeleton (clocks and power limits from NVML, the rest from its
reference profile, :func:`kdvfs.runtime.device.profile_skeleton.reference_profile`) with the reference
profile's cost-model parameters. The measurements become a sweep (``kdvfs.envs.calibration.sweep`` schema,
clocks snapped to the supported ones) and :func:`kdvfs.envs.calibration.calibrate` fits what the sweep
determines. Read-only measurements (default clocks only) determine static, core-idle, per-class core and
data-movement power; the voltage curve, leakage, the traffic's core share, the memory background power and
the time parameters need other clocks and are kept from the shipped profile, and the profile says so.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from kdvfs.envs.calibration.calibrate import Calibration, calibrate
from kdvfs.envs.calibration.sweep import Sweep
from kdvfs.envs.gpu.profile_io import write_profile_yaml
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.runtime.device.nvml_device import LocalGpu
from kdvfs.runtime.device.profile_skeleton import reference_profile, skeleton_profile
from kdvfs.runtime.microbench.measure import Measurement

READ_ONLY_FIXED = ("voltage_min", "voltage_knee_fraction", "leakage_w", "traffic_core_share")
"""Parameters default-clock data cannot separate (as in the shipped H200 fit, ``make calibrate``)."""
HEADER = "# GPU profile written by `kdvfs calibrate`; `sources` and each cost-model source say what was measured.\n"


def nearest_clock(value: float, options: Sequence[int]) -> int:
    """The clock of ``options`` (MHz) closest to ``value``."""
    return min(options, key=lambda option: abs(option - value))


def measurements_to_sweep(rows: Sequence[Measurement], profile: GpuProfile, source: str) -> Sweep:
    """The measurements as a sweep; each row's observed clocks snapped to the profile's supported clocks."""
    names: dict[str, int] = {}
    index = [names.setdefault(row.kernel, len(names)) for row in rows]
    mem = [nearest_clock(row.mem_mhz, profile.clocks.memory_mhz) for row in rows]
    core = [nearest_clock(row.core_mhz, profile.clocks.core_mhz[m]) for row, m in zip(rows, mem, strict=True)]
    features = np.asarray([row.features for row in rows], dtype=np.float64).reshape(-1, 3)
    return Sweep(source, tuple(names), np.asarray(index), np.asarray(core, dtype=np.float64),
                 np.asarray(mem, dtype=np.float64), np.asarray([row.time_s for row in rows]),
                 np.asarray([row.power_w for row in rows]), features[:, 0], features[:, 1], features[:, 2])


def starting_mapping(gpu: LocalGpu, name: str) -> dict[str, Any]:
    """The GPU's profile skeleton with its reference profile's cost-model parameters."""
    mapping = skeleton_profile(gpu, name)
    reference = reference_profile(gpu.name)
    mapping["cost_model"] = {
        key: replace(p, source=f"kept from the shipped profile {reference.name}: {p.source}").as_mapping()
        for key, p in reference.cost_model.items()}
    return mapping


def load_mapping(mapping: dict[str, Any]) -> GpuProfile:
    """Validate a profile mapping by writing it to a temporary file and loading it."""
    with tempfile.TemporaryDirectory(prefix="kdvfs-calibrate-") as folder:
        return write_profile_yaml(mapping, Path(folder) / f"{mapping['name']}.yaml")


def fit_mapping(mapping: dict[str, Any], sweep: Sweep, fixed: Sequence[str], how: str,
                idle_w: float | None = None) -> tuple[dict[str, Any], Calibration]:
    """The profile mapping with its cost model fitted to ``sweep`` (``fixed`` kept) and its sources updated.

    ``how`` says what was measured (e.g. "read-only at default clocks on GPU 0"); ``idle_w`` replaces the
    profile's idle power when measured.
    """
    result = calibrate(load_mapping(mapping), sweep, fixed)
    kept = [name for name in result.entries if name not in result.fitted]
    date = datetime.now(UTC).date().isoformat()
    note = (f"cost model: {', '.join(result.fitted)} fitted by `kdvfs calibrate` {how} ({date}); "
            f"{', '.join(kept)} kept as listed (not determined by these measurements)")
    power = {**mapping["power"], **({"idle_w": idle_w} if idle_w is not None else {})}
    cost_model = {name: p.as_mapping() for name, p in result.entries.items()}
    return {**mapping, "sources": [*mapping["sources"], note], "power": power, "cost_model": cost_model}, result


def write_calibrated(mapping: dict[str, Any], path: Path) -> GpuProfile:
    """Write the calibrated profile (validated, atomically)."""
    return write_profile_yaml(mapping, path, HEADER)
