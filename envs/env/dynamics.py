"""The disturbances of one ``KernelDVFS-v0`` episode, drawn at reset, and a fixed schedule run through them.

An episode is a *run* of ``run_steps`` repetitions of a step. At reset, from the environment's ``np_random`` in
this order (one that is off draws nothing, so the others' draws are those of a configuration without it):
duration noise, each kernel's time and energy x exp(N(0, ``duration_noise``)); drift (``drift``), the run
starting ``t0 ~ U(0, run_start_s)`` s into training, the limiter's thermal drift
(:class:`kdvfs.envs.model.drift.DriftModel`) slowing the auto levels' kernels and raising every pair's energy,
a locked core clock f slowing only above what the limiter holds (f / f_max > 1 / (1 + drift):
:meth:`Disturbances.locked_factors`); step jitter (``step_jitter``), one time and one energy factor per step
(:data:`MEASURED_DRIFT`'s spreads); latency (``latency_noise``), the i-th request taking max(0, N(latency,
spread)) s. :func:`execute_open_loop` runs a planner's fixed schedule through the same draws, so that a policy
and the planners are scored on equal terms (``kdvfs evaluate --episodes``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.envs.model.drift import DriftModel
from kdvfs.envs.model.schedule import ActionCosts, Outcome, replay, request_times

MEASURED_DRIFT = DriftModel()
"""The drift and jitter the environment draws: :class:`~kdvfs.envs.model.drift.DriftModel`'s defaults (an H200's
without clock control; ``docs/results.md``)."""


@dataclass(frozen=True)
class DisturbanceSettings:
    """The disturbance fields of :class:`kdvfs.envs.env.config.EnvConfig` with the switching figures
    (``drift_pct`` 0: no drift)."""

    duration_noise: float
    drift_pct: float
    drift_s: float
    run_start_s: float
    step_jitter: bool
    latency_noise: bool
    latency_s: float
    latency_std_s: float


@dataclass(frozen=True)
class Disturbances:
    """One episode's draws over the run's K kernels.

    Attributes:
        time_auto: (K,) factor on each kernel's time at the auto core level; None: 1.
        time_locked: (K,) the same at a locked core clock; None: 1.
        energy: (K,) factor on each kernel's energy at every pair; None: 1.
        latencies_s: latency of the episode's i-th request (s); None: every request takes the mean.
        latency_s: the mean switching latency (s).
    """

    time_auto: Array | None
    time_locked: Array | None
    energy: Array | None
    latencies_s: Array | None
    latency_s: float

    def latency(self, request: int) -> float:
        """Switching latency of the episode's ``request``-th request (s), counted from 0."""
        return self.latency_s if self.latencies_s is None else float(self.latencies_s[request])

    def auto_drift_pct(self, kernel: int) -> float:
        """How much slower auto's core runs than a locked clock at run kernel ``kernel`` (%): the drift."""
        if self.time_auto is None or self.time_locked is None:
            return 0.0
        return 100.0 * (float(self.time_auto[kernel]) / float(self.time_locked[kernel]) - 1.0)

    def locked_factors(self, core_fraction: Array) -> Array | None:
        """(K, A) factors on the kernels' times at locked core clocks ``core_fraction`` (A,) of the maximum:
        the step jitter, and the drift above the clock the power limiter now holds; None: 1."""
        if self.time_auto is None or self.time_locked is None:
            return None
        return np.maximum(self.time_locked[:, None], self.time_auto[:, None] * core_fraction[None, :])

    def apply(self, costs: ActionCosts) -> ActionCosts:
        """``costs`` (the run's K kernels) with this episode's factors (auto actions: NaN core clock)."""
        auto = np.isnan(costs.core_mhz)
        ones = np.ones(costs.kernels)
        time_auto = ones if self.time_auto is None else self.time_auto
        locked = self.locked_factors(core_fractions(costs.core_mhz))
        time_locked = ones[:, None] if locked is None else locked
        time_s = costs.time_s * np.where(auto[None, :], time_auto[:, None], time_locked)
        energy_j = costs.energy_j * (ones if self.energy is None else self.energy)[:, None]
        return ActionCosts(time_s, energy_j, costs.core_mhz, costs.mem_mhz, costs.auto_index, costs.idle_power_w)


def core_fractions(core_mhz: Array) -> Array:
    """(A,) each action's locked core clock as a fraction of the highest (``core_mhz``: NaN for auto, 0 here):
    what :meth:`Disturbances.locked_factors` takes."""
    return np.nan_to_num(core_mhz / np.nanmax(core_mhz))


def draw(rng: np.random.Generator, settings: DisturbanceSettings, step_kernels: int, run_steps: int,
         step_auto_time_s: float) -> Disturbances:
    """Draw an episode's disturbances for a run of ``run_steps`` steps of ``step_kernels`` kernels each
    (``step_auto_time_s``: a step's time in auto mode, s), in the order of the module docstring."""
    kernels = step_kernels * run_steps
    noise = np.exp(rng.normal(0.0, settings.duration_noise, kernels)) if settings.duration_noise > 0 else None
    time_auto = time_locked = energy = noise
    if settings.drift_pct > 0 or settings.step_jitter:
        model = DriftModel(energy_drift_pct=settings.drift_pct, time_drift_pct=settings.drift_pct,
                           drift_s=settings.drift_s)
        time_auto, time_locked, energy = _drift_factors(rng, model, settings, run_steps, step_auto_time_s)
        base = np.ones(kernels) if noise is None else noise
        time_auto, time_locked, energy = (base * np.repeat(f, step_kernels) for f in (time_auto, time_locked, energy))
    latencies = None
    if settings.latency_noise and settings.latency_std_s > 0:
        latencies = np.maximum(0.0, rng.normal(settings.latency_s, settings.latency_std_s, kernels))
    return Disturbances(time_auto, time_locked, energy, latencies, settings.latency_s)


def _drift_factors(rng: np.random.Generator, model: DriftModel, settings: DisturbanceSettings, run_steps: int,
                   step_auto_time_s: float) -> tuple[Array, Array, Array]:
    """Per step of the run: factors on (auto time, locked time, energy) from drift and step jitter."""
    time_drift, energy_drift = np.zeros(run_steps), np.zeros(run_steps)
    if settings.drift_pct > 0:
        start_s = float(rng.uniform(0.0, settings.run_start_s))
        for step in range(run_steps):
            time_drift[step], energy_drift[step] = model.drift_pct(start_s + step * step_auto_time_s)
    jitter_time, jitter_energy = np.zeros(run_steps), np.zeros(run_steps)
    if settings.step_jitter:
        sd_time_pct, sd_energy_pct = MEASURED_DRIFT.step_sd_pct()
        draws = rng.standard_normal((run_steps, 2))
        jitter_time, jitter_energy = draws[:, 0] * sd_time_pct, draws[:, 1] * sd_energy_pct
    locked = 1.0 + jitter_time / 100
    return (1.0 + time_drift / 100) * locked, locked, (1.0 + energy_drift / 100) * (1.0 + jitter_energy / 100)


def execute_open_loop(costs: ActionCosts, actions: Array, disturbances: Disturbances, stall_s: float) -> Outcome:
    """A fixed schedule of the run (``costs``: its mean costs) executed through ``disturbances``.

    The controller plans its requests on the mean costs (:func:`kdvfs.envs.model.schedule.request_times`)
    and issues each at its planned offset from the start of the kernel running then (its anchor), on the
    actual timeline; the i-th request takes the i-th drawn latency; kernels run at the disturbed costs."""
    actions = np.asarray(actions, dtype=np.int64)
    mean = disturbances.latency_s
    changes, effective = request_times(costs, actions, mean)
    noisy = disturbances.apply(costs)
    if len(changes) == 0:
        return replay(noisy, actions.copy(), stall_s)
    durations = costs.time_s[np.arange(costs.kernels), actions]
    planned_start = np.cumsum(durations) - durations
    issued = effective - mean
    anchors = np.maximum(planned_start.searchsorted(issued, side="right") - 1, 0)
    offsets = issued - planned_start[anchors]
    applied = np.empty_like(actions)
    in_effect, next_issue, next_apply, now = actions[0], 0, 0, 0.0
    takes_effect = np.full(len(changes), np.inf)
    for kernel in range(costs.kernels):
        while next_issue < len(changes) and anchors[next_issue] <= kernel:
            takes_effect[next_issue] = now + offsets[next_issue] + disturbances.latency(next_issue)
            next_issue += 1
        while next_apply < next_issue and takes_effect[next_apply] <= now + 1e-12:
            in_effect = actions[changes[next_apply]]
            next_apply += 1
        applied[kernel] = in_effect
        now += noisy.time_s[kernel, in_effect]
    return replay(noisy, applied, stall_s)
