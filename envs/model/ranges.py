"""Two-sided ranges with a stated coverage on every predicted figure.

A figure's error is taken on the log scale as the sum of independent parts: the parameters' own uncertainty
(the log deviations ``d_i = log(x_i / x_0)`` over sampled profiles, :mod:`kdvfs.envs.model.uncertainty`) and
the model's validated error (:mod:`kdvfs.envs.model.model_error`: empirical log residuals, each body weighted by
how much of the figure it applies to). The range is a pair of quantiles of that sum at the split-conformal
levels of the scarcest body of ``n`` residuals (below ``2 / (1 - coverage) - 1`` residuals, the extremes, and
coverage is not guaranteed). Never one-sided: each end lies at least :data:`MIN_HALF_WIDTH` (log scale) from
the figure; only a figure exact by definition (auto against itself) has the range ``[x, x]``. Derivation:
``docs/design/cost-model.md`` (Uncertainty).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.errors import KdvfsError
from kdvfs.envs.model.model_error import RangeBasis
from kdvfs.envs.model.schedule import ActionCosts

COVERAGE = 0.9
"""The share of true figures a range is built to hold."""
MIN_HALF_WIDTH = 1e-3
"""Smallest distance (log scale, ~0.1%) from a figure to either end of its range: finer than any measurement of a
step's time or energy resolves."""

Term = tuple[Array, float]
"""Residuals (log scale) and the weight they enter with (0: not at all, 1: in full)."""


def quantile_levels(count: int, coverage: float = COVERAGE) -> tuple[float, float]:
    """The lower and upper quantile levels of a two-sided range from ``count`` residuals (split conformal:
    the ``floor((n+1) a/2)``-th and ``ceil((n+1)(1-a/2))``-th order statistics, clipped to the extremes)."""
    if not 0 < coverage < 1:
        raise KdvfsError(f"coverage {coverage} must lie in (0, 1)")
    if count < 1:
        raise KdvfsError("a range needs at least one residual")
    miss, rounding = 1.0 - coverage, 1e-9  # (n + 1) a / 2 may be a whole number in exact arithmetic only
    low = max(math.floor((count + 1) * miss / 2 + rounding), 1)
    high = min(math.ceil((count + 1) * (1 - miss / 2) - rounding), count)
    return low / count, high / count


def log_bounds(deviations: Array, terms: Sequence[Term], coverage: float = COVERAGE) -> tuple[float, float]:
    """``(low, high)`` on the log scale of the sum of a parameter deviation (one of ``deviations``, equally
    likely) and each term's weighted residual (one of its residuals, equally likely), independent.

    ``low < 0 < high`` by at least :data:`MIN_HALF_WIDTH` unless nothing varies (every deviation 0 and every
    weight 0), when it is ``(0, 0)``."""
    combined = np.asarray(deviations, dtype=np.float64).ravel()
    if combined.size == 0:
        combined = np.zeros(1)
    active = [(np.asarray(values, dtype=np.float64), weight) for values, weight in terms if weight > 0]
    if not active and not np.any(combined):
        return 0.0, 0.0
    for values, weight in active:
        combined = (combined[:, None] + weight * values[None, :]).ravel()
    count = min((len(values) for values, _ in active), default=len(combined))
    low_level, high_level = quantile_levels(count, coverage)
    low, high = np.quantile(combined, [low_level, high_level], method="inverted_cdf")
    return min(float(low), -MIN_HALF_WIDTH), max(float(high), MIN_HALF_WIDTH)


def scaled(value: float, bounds: tuple[float, float]) -> list[float]:
    """``[value e^low, value e^high]``: a positive figure's range from its log bounds."""
    return [value * math.exp(bounds[0]), value * math.exp(bounds[1])]


def saving_range_pct(ratio: float, bounds: tuple[float, float]) -> list[float]:
    """Range of a saving ``100 (1 - ratio)`` (%) from the log bounds of ``ratio`` (a figure over auto's)."""
    return [100.0 * (1.0 - ratio * math.exp(bounds[1])), 100.0 * (1.0 - ratio * math.exp(bounds[0]))]


def slowdown_range_pct(ratio: float, bounds: tuple[float, float]) -> list[float]:
    """Range of a slowdown ``100 (ratio - 1)`` (%) from the log bounds of ``ratio`` (a time over auto's)."""
    return [100.0 * (ratio * math.exp(bounds[0]) - 1.0), 100.0 * (ratio * math.exp(bounds[1]) - 1.0)]


def changed_shares(costs: ActionCosts, applied: Array) -> tuple[float, float]:
    """Shares of auto's step time and energy in kernels (with their preceding gaps) that ran at another action
    than auto: how much of a step a change of clocks touches (0 for auto itself, 1 when every kernel moved)."""
    moved = np.asarray(applied) != costs.auto_index
    auto_time, auto_energy = costs.time_s[:, costs.auto_index], costs.energy_j[:, costs.auto_index]
    return float(auto_time[moved].sum() / auto_time.sum()), float(auto_energy[moved].sum() / auto_energy.sum())


def log_deviations(nominal: float, sampled: Sequence[float]) -> Array:
    """``log(x_i / x_0)`` of each sampled figure against the nominal one (the nominal itself included, as 0)."""
    return np.log(np.asarray([nominal, *sampled], dtype=np.float64) / nominal)


def level_range(value: float, figure: str, basis: RangeBasis, coverage: float = COVERAGE) -> list[float]:
    """Range of a step's ``figure`` (``step_time_s``, ``energy_j``, ``avg_power_w``) at the clocks and power limit
    it was recorded at: the level evidence alone. Its residuals were measured with the nominal parameters, so
    they hold the parameters' error already."""
    return scaled(value, log_bounds(np.zeros(1), [(basis.level.values[figure], 1.0)], coverage))


def moved_range(value: float, figure: str, basis: RangeBasis, deviations: Array,
                coverage: float = COVERAGE) -> list[float]:
    """Range of a step's ``figure`` at other clocks or another power limit than recorded (every kernel moved):
    its parameter ``deviations`` (:func:`log_deviations`), the level and the clocks evidence in full."""
    terms = [(basis.level.values[figure], 1.0), (basis.clocks.values[figure], 1.0)]
    return scaled(value, log_bounds(deviations, terms, coverage))


def change_ranges(energy_ratio: float, time_ratio: float, shares: tuple[float, float], basis: RangeBasis,
                  energy_deviations: Array, time_deviations: Array, coverage: float = COVERAGE
                  ) -> tuple[list[float], list[float]]:
    """Ranges of a schedule's energy saved and slowdown (%) against auto, from its energy and time ratios to auto.

    A saving is a difference taken within one model, so the model's error common to both (the level evidence)
    cancels: what remains is each ratio's parameter deviations (the schedule priced on each sampled profile
    against that profile's auto) and the clocks evidence weighted by the share of auto's time or energy whose
    clocks the schedule moved (``shares`` = :func:`changed_shares`)."""
    time_share, energy_share = shares
    energy = log_bounds(energy_deviations, [(basis.clocks.values["energy_j"], energy_share)], coverage)
    time = log_bounds(time_deviations, [(basis.clocks.values["step_time_s"], time_share)], coverage)
    return saving_range_pct(energy_ratio, energy), slowdown_range_pct(time_ratio, time)


def range_json(figures: Mapping[str, list[float]], basis: RangeBasis, samples: int, seed: int,
               coverage: float = COVERAGE) -> dict[str, Any]:
    """A ``range`` object of the JSON output: each figure's ``[low, high]``, the coverage, how many sampled
    profiles entered (0: the validated error alone) with their seed, and the evidence (``basis``)."""
    return {**figures, "coverage": coverage, "parameter_samples": samples, "seed": seed, "basis": basis.as_json()}
