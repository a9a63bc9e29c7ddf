"""Calibrate a GPU profile's cost-model parameters from a sweep (what ``kdvfs model fit`` does)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.calibration.fit import (
    POWER_PARAMS,
    TIME_PARAMS,
    fit_params,
    identifiable,
    initial_params,
    param_bounds,
    predict_power_w,
    predict_time_s,
)
from kdvfs.envs.calibration.sweep import Sweep
from kdvfs.envs.gpu.profiles import CostParam, GpuProfile
from kdvfs.envs.model.cost_model import ClockLimits, CostParams


@dataclass(frozen=True)
class Calibration:
    """Result of a fit: the new parameter table, which names were fitted, and in-sample errors (fractions)."""

    params: CostParams
    entries: dict[str, CostParam]
    fitted: tuple[str, ...]
    time_mape: float
    power_mape: float


def starting_params(profile: GpuProfile, sweep: Sweep) -> tuple[CostParams, dict[str, CostParam]]:
    """The profile's parameters where it has them (any status), neutral starting values elsewhere."""
    max_power_w = float(sweep.power_w.max())
    default = initial_params(max_power_w)
    entries = {}
    for name in CostParams.names():
        (low,), (high,) = param_bounds([name], max_power_w)
        value = getattr(default, name)
        entries[name] = profile.cost_model.get(name) or CostParam(
            value, "estimate", "kdvfs neutral starting value", (min(low, value), max(high, value)),
            "kdvfs fit bounds: nothing is known of this parameter")
    return CostParams(**{name: e.value for name, e in entries.items()}), entries


def calibrate(profile: GpuProfile, sweep: Sweep, fixed: Sequence[str] = ()) -> Calibration:
    """Fit every parameter the sweep determines, except ``fixed`` ones, starting from the profile's values."""
    unknown = sorted(set(fixed) - set(CostParams.names()))
    if unknown:
        raise KdvfsError(f"unknown parameter(s) {unknown} in --fix; parameters are {list(CostParams.names())}")
    sweep.check_clocks(profile)
    sweep = replace(sweep, grid_limits=ClockLimits.of(profile))
    start, entries = starting_params(profile, sweep)
    free = [n for n in identifiable(sweep, TIME_PARAMS + POWER_PARAMS) if n not in fixed]
    params = fit_params(sweep, start, free)
    source = f"kdvfs model fit on {Path(sweep.source).name} ({datetime.now(UTC).date().isoformat()})"
    for name in free:
        entries[name] = CostParam(getattr(params, name), "calibrated", source)
    time = predict_time_s(params, sweep)
    power = predict_power_w(params, sweep, sweep.time_s, reference_power=False)
    return Calibration(params, entries, tuple(free), float(np.mean(np.abs(time / sweep.time_s - 1))),
                       float(np.mean(np.abs(power / sweep.power_w - 1))))
