"""The switching regimes a ``KernelDVFS-v0`` draws its episodes from (``EnvConfig.latency_scales``).

One policy serves every latency its GPU shows, ideal switching included: each episode runs at one of the
configured multiples of the mean switching latency, with that regime's spread, stall and decision interval.
The observation states the episode's latency (``conditions`` block), so the policy can tell them apart.
What depends only on a step and a regime (the decision-point observations, the plan advice) is computed
once per process (:func:`decision_data`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.errors import KdvfsError
from kdvfs.envs.env.advice.plan_advice import PlanAdvice, plan_advice
from kdvfs.envs.env.config import EnvConfig, Switching
from kdvfs.envs.env.dynamics import DisturbanceSettings
from kdvfs.envs.env.observing.observation import ObservationSpec, static_observations, window_bounds
from kdvfs.envs.env.steps.step_data import StepData
from kdvfs.envs.gpu.profiles import GpuProfile

_Key = tuple[ObservationSpec, Switching, float]
_CACHE: weakref.WeakKeyDictionary[StepData, dict[_Key, tuple[Array, PlanAdvice]]] = weakref.WeakKeyDictionary()
"""Decision-point observations and plan advice per step, regime and plans' shortest segment, shared by the envs of
one process."""


@dataclass(frozen=True)
class Timing:
    """One switching regime.

    Attributes:
        switching: mean latency, its spread and the stall per change (s); all 0 with ideal switching.
        decision_interval_s: least time between decision points (s; 0: every kernel).
        disturbances: the disturbance settings with this regime's latency figures.
        plan_segment_s: the plan advisors' shortest segment (s): the latency plus its spread, at least the
            config's ``min_segment_s``.
    """

    switching: Switching
    decision_interval_s: float
    disturbances: DisturbanceSettings
    plan_segment_s: float


def timings(config: EnvConfig, profile: GpuProfile) -> tuple[Timing, ...]:
    """One :class:`Timing` per ``config.latency_scales``, in order: scale s runs at s x the mean latency
    (``config.switching(profile)``), s x its spread and the same stall; s = 0 is ideal switching (no
    spread, no stall)."""
    base = config.switching(profile)
    regimes = []
    for scale in config.latency_scales:
        switching = Switching(base.latency_s * scale, base.latency_std_s * scale,
                              base.stall_s if scale > 0 and base.latency_s > 0 else 0.0)
        regimes.append(Timing(switching, config.decision_latencies * switching.latency_s,
                              config.disturbances(switching),
                              max(switching.latency_s + switching.latency_std_s, config.min_segment_s)))
    return tuple(regimes)


def regime_index(scales: tuple[float, ...], options: dict[str, Any], rng: np.random.Generator) -> int:
    """An episode's regime: ``options["latency_scale"]`` (one of ``scales``), else drawn with ``rng`` (no draw
    with one regime, so seeded episodes of a one-regime config keep their draws)."""
    if "latency_scale" in options:
        if float(options["latency_scale"]) not in scales:
            raise KdvfsError(f"latency_scale {options['latency_scale']} is not one of {list(scales)}")
        return scales.index(float(options["latency_scale"]))
    return int(rng.integers(len(scales))) if len(scales) > 1 else 0


def decision_data(step: StepData, spec: ObservationSpec, timing: Timing) -> tuple[Array, PlanAdvice]:
    """The decision-point part of every observation of ``step`` under ``timing`` and its plan advice (segments
    at least ``timing.plan_segment_s`` long), computed once per process and read-only."""
    latency_s, _, stall_s = timing.switching
    cached = _CACHE.setdefault(step, {})
    key = (spec, timing.switching, timing.plan_segment_s)
    if key not in cached:
        effect = window_bounds(step.cumulative[:, 0, 0], latency_s, (1.0,))[:, 0]
        plans = plan_advice(step, spec.plan_budgets, effect, timing.plan_segment_s, stall_s)
        cached[key] = (static_observations(step, spec, latency_s), plans)
    return cached[key]
