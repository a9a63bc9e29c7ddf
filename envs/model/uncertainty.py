"""Parameter uncertainty: profiles drawn over the plausible ranges a GPU profile states.

Every cost-model parameter with a ``range`` (required for an ``estimate``) and the switching latency
(``switching.latency_range_s``, else mean +- 2 std) are varied together: a seeded Latin-hypercube sample of
``samples`` points, uniform within each range, parameters independent. A figure priced on each sampled profile
is the parameters' part of its range (:mod:`kdvfs.envs.model.ranges`).

An estimate transferred from another GPU (``transferred_from`` in the profile) has a range that describes the
GPU it came from; the transfer adds its own error, so its range is widened by :data:`TRANSFER_WIDENING` about
the value, within the parameter's valid bounds (``COST_PARAM_RANGES``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

import numpy as np

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.gpu.profiles import COST_PARAM_RANGES, CostParam, GpuProfile

LATENCY = "switching.latency_mean_s"
METHOD = "latin-hypercube"
DEFAULT_SAMPLES = 16
TRANSFER_WIDENING = 1.5
"""Factor by which a transferred estimate's distance from its value to each end of its range grows."""


@dataclass(frozen=True)
class UncertaintySpec:
    """How a figure's range is found: ``samples`` profiles of a seeded Latin-hypercube sample."""

    samples: int = DEFAULT_SAMPLES
    seed: int = 0
    vary_latency: bool = True

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise KdvfsError(f"--samples {self.samples} must be at least 1")


def ranged_parameters(profile: GpuProfile, vary_latency: bool = True) -> dict[str, tuple[float, float]]:
    """Every parameter of ``profile`` with a plausible range, and its ``(low, high)``."""
    ranges = {name: plausible_range(name, p) for name, p in profile.cost_model.items() if p.range is not None}
    if vary_latency:
        ranges[LATENCY] = profile.switching.plausible_latency_s
    return ranges


def plausible_range(name: str, param: CostParam) -> tuple[float, float]:
    """The ``(low, high)`` a parameter is varied over: its range, widened by :data:`TRANSFER_WIDENING` about its
    value when it was transferred from another GPU, clipped to the parameter's valid bounds."""
    if param.range is None:
        return param.value, param.value
    low, high = param.range
    if param.transferred_from is None:
        return low, high
    floor, ceiling = COST_PARAM_RANGES.get(name, (-np.inf, np.inf))
    return (max(floor, param.value - TRANSFER_WIDENING * (param.value - low)),
            min(ceiling, param.value + TRANSFER_WIDENING * (high - param.value)))


def with_values(profile: GpuProfile, values: Mapping[str, float]) -> GpuProfile:
    """``profile`` with the given parameter values (names as in :func:`ranged_parameters`)."""
    cost_model = {name: _with_value(p, values[name]) if name in values else p
                  for name, p in profile.cost_model.items()}
    switching = profile.switching
    if LATENCY in values:
        switching = replace(switching, latency_mean_s=values[LATENCY])
    return replace(profile, cost_model=cost_model, switching=switching)


def _with_value(param: CostParam, value: float) -> CostParam:
    """``param`` at ``value``, its stated range stretched to hold it (a widened transferred range may not)."""
    bounds = None if param.range is None else (min(param.range[0], value), max(param.range[1], value))
    return replace(param, value=value, range=bounds)


def sampled_profiles(profile: GpuProfile, spec: UncertaintySpec) -> list[GpuProfile]:
    """``spec.samples`` variants of ``profile`` drawn over its parameter ranges (seeded, reproducible)."""
    from scipy.stats import qmc  # here, not at import: every CLI command loads this module, few sample

    ranges = ranged_parameters(profile, spec.vary_latency)
    if not ranges:
        return []
    unit = qmc.LatinHypercube(d=len(ranges), seed=spec.seed).random(spec.samples)
    low = np.array([bounds[0] for bounds in ranges.values()])
    high = np.array([bounds[1] for bounds in ranges.values()])
    points = low + unit * (high - low)
    return [with_values(profile, dict(zip(ranges, map(float, point), strict=True))) for point in points]


def over_samples(profile: GpuProfile, spec: UncertaintySpec, progress: Callable[[int, int], None] | None = None
                 ) -> Iterator[GpuProfile]:
    """The sampled profiles one by one, reporting ``(done, total)`` to ``progress`` after each."""
    profiles = sampled_profiles(profile, spec)
    for done, sample in enumerate(profiles, start=1):
        yield sample
        if progress:
            progress(done, len(profiles))
