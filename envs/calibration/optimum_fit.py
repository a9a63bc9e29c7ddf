"""Fit and check cost-model parameters against a published per-kernel optimum (arXiv 2601.08539, Table 1).

The paper measured each kernel alone in a loop (25 s warm-up, 5 s measured), so here each kernel is its
own power-limiter window (:data:`STEADY_WINDOW_S`): a steady loop of one kernel gets its own capped clock.
A published pair's time and energy change is the kernel (and its launch gap) at that action against auto at
the default memory clock. The fit minimises, over the kernels it is given, the changes' errors in units of
half the targets' tolerances (1 point of time, 2.5 points of energy) under a robust loss (the paper notes
that per-kernel selection gravitates to measurement outliers), plus a weak prior pulling each parameter
towards its prior value by its plausible range. The fit starts from the prior and from seeded points within
the ranges and keeps the best (:func:`fit_published_multistart`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares
from scipy.stats import qmc

from kdvfs.common.arrays import Array
from kdvfs.envs.calibration.fit import POWER_PARAMS, TIME_PARAMS, param_bounds
from kdvfs.envs.calibration.published_optimum import PublishedKernel
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.cost_model import CostParams
from kdvfs.envs.model.cost_tables import build_tables
from kdvfs.envs.model.schedule import ActionCosts
from kdvfs.envs.trace.trace import Trace

STEADY_WINDOW_S = 1e-9
TIME_SCALE_PCT = 1.0
ENERGY_SCALE_PCT = 2.5
TABLE1_FREE = (*TIME_PARAMS, *POWER_PARAMS, "boost_limit_fraction")


def action_label(row: PublishedKernel, profile: GpuProfile) -> str:
    """The action of a published pair, e.g. ``"1680:5001"`` or ``"auto:9501"`` (auto memory: the default)."""
    mem = row.mem_mhz or profile.clocks.default_memory_mhz
    return f"{'auto' if row.core_mhz is None else row.core_mhz}:{mem}"


def steady_profile(profile: GpuProfile) -> GpuProfile:
    """``profile`` with every kernel in its own power-limiter window (each kernel as if looped alone)."""
    window = profile.cost_model["power_window_s"]
    window = replace(window, value=STEADY_WINDOW_S,
                     range=None if window.range is None else (STEADY_WINDOW_S, STEADY_WINDOW_S))
    return replace(profile, cost_model={**profile.cost_model, "power_window_s": window})


def steady_costs(params: CostParams, profile: GpuProfile, step: Trace) -> ActionCosts:
    """Every action's cost of each kernel of ``step`` run alone in a loop (its own limiter window)."""
    return ActionCosts.from_tables(build_tables(step, profile, replace(params, power_window_s=STEADY_WINDOW_S)))


def changes_pct(costs: ActionCosts, actions: Array) -> tuple[Array, Array]:
    """(K,) time and energy change (%) of each kernel at its action against auto."""
    kernels = np.arange(costs.kernels)
    auto = costs.auto_index
    return (100.0 * (costs.time_s[kernels, actions] / costs.time_s[:, auto] - 1.0),
            100.0 * (costs.energy_j[kernels, actions] / costs.energy_j[:, auto] - 1.0))


def published_changes(params: CostParams, profile: GpuProfile, step: Trace, rows: Sequence[PublishedKernel]
                      ) -> tuple[Array, Array]:
    """The model's time and energy change (%) of each Table 1 kernel at its published pair."""
    costs = steady_costs(params, profile, step)
    return changes_pct(costs, np.array([costs.index_of(action_label(row, profile)) for row in rows]))


@dataclass(frozen=True)
class Table1Fit:
    """A fit's parameters, the names it freed, its robust cost on the fitted kernels and each freed
    parameter's standard error (linearised least squares, the prior included)."""

    params: CostParams
    free: tuple[str, ...]
    cost: float
    std: Mapping[str, float]


def fit_published(profile: GpuProfile, step: Trace, rows: Sequence[PublishedKernel], start: CostParams,
                  ranges: Mapping[str, tuple[float, float]], free: Sequence[str] = TABLE1_FREE,
                  prior: CostParams | None = None, max_evaluations: int = 400) -> Table1Fit:
    """Fit ``free`` parameters to the published changes of ``rows`` (only the rows given: pass the fit half).

    ``step`` holds one kernel per row, in order. ``ranges`` (every free name) scale the prior that pulls each
    parameter towards ``prior`` (default ``start``); fit bounds are those of
    :func:`kdvfs.envs.calibration.fit.param_bounds`.
    """
    names = list(free)
    low, high = (np.array(b) for b in param_bounds(names, 2.0 * profile.power.limit_w))
    x0 = np.clip([getattr(start, n) for n in names], low, high)
    centre = np.clip([getattr(prior or start, n) for n in names], low, high)
    width = np.array([ranges[n][1] - ranges[n][0] for n in names])
    published = np.array([[r.time_pct, r.energy_pct] for r in rows])
    actions: list[int] = []

    def residuals(values: Array) -> Array:
        params = replace(start, **dict(zip(names, (float(v) for v in values), strict=True)))
        costs = steady_costs(params, profile, step)
        if not actions:
            actions.extend(costs.index_of(action_label(row, profile)) for row in rows)
        time, energy = changes_pct(costs, np.array(actions))
        return np.r_[(time - published[:, 0]) / TIME_SCALE_PCT, (energy - published[:, 1]) / ENERGY_SCALE_PCT,
                     (values - centre) / np.maximum(width, 1e-12)]

    result = least_squares(residuals, x0, bounds=(low, high), x_scale=np.maximum(high - low, 1e-12) / 10,
                           loss="soft_l1", max_nfev=max_evaluations)
    params = replace(start, **dict(zip(names, (float(v) for v in result.x), strict=True)))
    std = np.sqrt(np.maximum(np.diag(np.linalg.pinv(result.jac.T @ result.jac)), 0.0))
    return Table1Fit(params, tuple(names), float(result.cost), dict(zip(names, map(float, std), strict=True)))


def fit_published_multistart(profile: GpuProfile, step: Trace, rows: Sequence[PublishedKernel], start: CostParams,
                             ranges: Mapping[str, tuple[float, float]], starts: int = 24, seed: int = 0,
                             free: Sequence[str] = TABLE1_FREE) -> Table1Fit:
    """The best of :func:`fit_published` from ``start`` and from ``starts`` seeded Latin-hypercube points
    within ``ranges`` (the auto clock at the cap makes the cost non-convex; the prior stays at ``start``)."""
    unit = qmc.LatinHypercube(d=len(free), seed=seed).random(starts)
    points = [start] + [replace(start, **{name: ranges[name][0] + float(u) * (ranges[name][1] - ranges[name][0])
                                          for name, u in zip(free, row, strict=True)}) for row in unit]
    fits = [fit_published(profile, step, rows, point, ranges, free, prior=start) for point in points]
    return min(fits, key=lambda fit: fit.cost)
