"""``KernelDVFSResidual-v0`` (experimental): set each kernel segment's clocks as a residual over the fitting plan,
observing only what a controller measures.

It executes as ``KernelDVFS-v0`` (:class:`~kdvfs.envs.env.dvfs_env.KernelDVFSEnv`: kernels, switching, disturbances,
executed variants) but observes :func:`~kdvfs.envs.env.observing.measured.residual_observation` of the state a
controller measures (:class:`~kdvfs.envs.env.observing.measured.Measurement`); its action is
``MultiDiscrete([len(CORE_STEPS), len(MEMORY_STEPS), MARGIN_ACTIONS])``, a core and a memory residual on the fitting
plan's pair and a margin on the budget (the zero action is the fitting plan), or the release of the clocks to auto
for the rest of the step (``RELEASE``: the run goes on to its end without another decision), held as a standing
order and decided at the step's start, at segment boundaries a controller acts on and at each budget event (the run
passing another ``1 / budget_events`` of its auto time). Reward: energy saved (% of the executed step's auto
energy), at the run's end minus ``overrun_penalty`` x the slowdown beyond the budget (%) and ``violation_penalty``
if over budget at all, against the auto time the GPU ran; ``info["violation"]``, ``info["budget"]`` and
``info["latency_scale"]`` let a constrained learner price violations per budget x latency cell. Design:
``docs/learning.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from kdvfs.common.arrays import Array
from kdvfs.common.errors import KdvfsError
from kdvfs.envs.env.advice.plan_advice import EPS
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.observing.live_tables import LiveTables
from kdvfs.envs.env.observing.measured import (
    CORE_STEPS,
    MARGIN_ACTIONS,
    MARGINS,
    MEMORY_STEPS,
    RELEASE,
    MeasuredState,
    Measurement,
    budget_use,
    drift_factors,
    policy_spec,
    residual_observation,
    residual_pair,
)
from kdvfs.envs.env.observing.observation import OBS_LIMIT
from kdvfs.envs.env.steps.step_data import StepData
from kdvfs.envs.gpu.profiles import GpuProfile

RESIDUAL_ENV_ID = "KernelDVFSResidual-v0"
PACE_RANGE = (0.05, 20.0)
"""The measured pace between anchors is held within this range (an interval of kernels that did not run reads 0)."""
RESIDUAL_SETTINGS: dict[str, Any] = {"residual_actions": True, "overrun_penalty": 2.0, "violation_penalty": 0.0,
                                     "decision_fraction": 0.0, "min_segment_s": 0.001}
"""What ``KernelDVFSResidual-v0``'s default settings change of :class:`EnvConfig`'s (the residual design: a small
linear overrun price, violations priced by a constraint, decisions at segment boundaries and budget events, plans
whose segments last at least 1 ms also with ideal switching, so that a controller placing itself by anchors lands
their clocks on the kernels they were planned for; chosen on the H200's validation pairs)."""
ZERO_ACTION = np.zeros(3, dtype=np.int64)
"""The action that follows the fitting plan exactly (no residual, no margin)."""
_SHARED_TABLES: dict[tuple[int, float, float, float], tuple[object, LiveTables]] = {}
"""The live tables of each step and regime, one copy per process: keyed by the identity of the step's plan advice
(computed once per process, :func:`~kdvfs.envs.env.timing.decision_data`, kept in the value so that the identity
stays its own) and the switching figures. Every environment over the same steps reads the same tables (each
environment holding its own copy of every step's grew to 7 GB a process in training)."""


class ResidualDVFSEnv(KernelDVFSEnv):
    """See the module docstring; arguments as :class:`~kdvfs.envs.env.dvfs_env.KernelDVFSEnv`'s (the config
    must set ``residual_actions``; None: :class:`EnvConfig` with ``RESIDUAL_SETTINGS``)."""

    def __init__(self, steps: Sequence[StepData] | None = None, gpu: GpuProfile | str = "h200",
                 config: EnvConfig | None = None, render_mode: str | None = None,
                 executed: Sequence[Sequence[StepData]] | None = None, **settings: Any) -> None:
        config = EnvConfig(**RESIDUAL_SETTINGS) if config is None else config
        super().__init__(steps, gpu, config, render_mode, executed, **settings)
        if not self.config.residual_actions:
            raise KdvfsError(f"{RESIDUAL_ENV_ID} needs residual_actions in its settings")
        self.policy_spec = policy_spec(self.observation_spec)
        self.observation_space = spaces.Box(-OBS_LIMIT, OBS_LIMIT, (self.policy_spec.size,), np.float32)
        self.action_space = spaces.MultiDiscrete([len(CORE_STEPS), len(MEMORY_STEPS), MARGIN_ACTIONS])
        self._policy_obs = np.zeros(self.policy_spec.size, dtype=np.float32)
        self._tables_key: tuple[int, float, float, float] | None = None
        self._tables: LiveTables | None = None
        self._start_measuring(0.0)

    def _start_measuring(self, drift_pct: float, drift_error_pct: float = 0.0, pace_sd: float = 0.0) -> None:
        """A new run's measurements, as a controller's A windows measure them at auto: the drift, auto's step
        time over the prediction's (the executed step's own error and auto's true drift ``drift_pct`` together,
        as the runtime's auto scale reads them: it cannot tell the two apart), off by ``drift_error_pct`` (%);
        anchors; the step's pace between them (each segment's auto time over the prediction's, relative to the
        whole step's, which the drift carries; measured with a relative error of ``pace_sd``); no history."""
        step_kernels = self._kernels // self.config.run_steps
        per_step = np.unique(np.linspace(0, step_kernels, self.config.anchors_per_step, endpoint=False).astype(int))
        anchors = (per_step[None, :] + step_kernels * np.arange(self.config.run_steps)[:, None]).ravel()
        paces, whole = None, 1.0
        if hasattr(self, "_executed"):
            bounds = np.append(anchors, self._kernels)
            predicted, executed = self._data.cumulative[bounds, 0, 0], self._executed.cumulative[bounds, 0, 0]
            whole = self._executed.auto_time_s / max(self._data.auto_time_s, 1e-12)
            paces = np.diff(executed) / np.maximum(np.diff(predicted), 1e-12) / whole
            paces = np.clip(np.where(np.diff(predicted) > 0, paces, 1.0), PACE_RANGE[0], PACE_RANGE[1])
            if pace_sd > 0:
                paces = paces * np.exp(self.np_random.normal(0.0, pace_sd, len(paces)))
        self._measured_drift_pct = 100.0 * (whole * (1.0 + drift_pct / 100.0) - 1.0) + drift_error_pct
        factors = drift_factors(self.grid.size, self._measured_drift_pct)
        self.measurement = Measurement(self._data.cumulative[:, 0, :], self.stall_s, anchors, factors, paces)
        self._started_s = np.zeros(self._kernels + 1)
        self._action = ZERO_ACTION.copy()
        self._next_event = 1
        self._pair = 0
        self._state = MeasuredState(0, 0, -1, 0.0, 0.0, 0.0, 0.0, self._measured_drift_pct)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Array, dict[str, Any]]:
        """As ``KernelDVFS-v0``'s reset, then the measurements are drawn (after every other draw)."""
        _, info = super().reset(seed=seed, options=options)
        error_pct = float(self.np_random.normal(0.0, self.config.drift_sd_pct))
        self._start_measuring(self.disturbances.auto_drift_pct(0), error_pct, self.config.drift_sd_pct / 100.0)
        self._reference = self._reference._replace(step_auto_energy_j=self._executed.auto_energy_j,
                                                   step_auto_time_s=self._executed.auto_time_s)
        return self._observe_policy(), info

    def _run_until(self, limit_s: float) -> None:
        """Run as the base environment does, keeping each kernel's start (host s) for the anchors."""
        k, elapsed_s = self._k, self._elapsed_s
        super()._run_until(limit_s)
        times, _ = self._column(self._in_effect)
        self._started_s[k:self._k] = elapsed_s + times[k:self._k] - times[k]

    def _apply_pending(self) -> None:
        """A change lands: the controller sees it land (its clock read), so the kernels before it count at the
        clocks they ran at and its position runs at the new clocks from here; then the change as in the base
        environment."""
        landed_s = self._elapsed_s
        position = self._position()
        super()._apply_pending()
        self.measurement.landed(landed_s, self._in_effect, position)

    def measured_state(self) -> MeasuredState:
        """The decision point as a controller measures it (:class:`~kdvfs.envs.env.observing.measured.Measurement`)."""
        pending_age_s = self._now_s - self._requested_at_s if self._pending >= 0 else 0.0
        if self._k == 0:
            return MeasuredState(0, self._in_effect, self._pending, 0.0, 0.0, 0.0, 0.0, self._measured_drift_pct)
        measurement, position = self.measurement, self._position()
        return MeasuredState(measurement.kernel(position), self._in_effect, self._pending, pending_age_s,
                             self._elapsed_s, measurement.model_elapsed(position), measurement.auto_elapsed(position),
                             self._measured_drift_pct, self._last_latency_ratio)

    def _position(self) -> float:
        """Where the controller places the GPU now (:meth:`~kdvfs.envs.env.observing.measured.Measurement.position`)."""
        if self._k == 0:
            return 0.0
        return self.measurement.position(self._k, float(self._started_s[self._anchor_before(self._k)]),
                                         self._elapsed_s)

    def _anchor_before(self, kernel: int) -> int:
        """The last anchor's kernel that started before ``kernel``."""
        anchors = self.measurement.anchors
        return int(anchors[max(int(np.searchsorted(anchors, kernel, side="left")) - 1, 0)])

    def tables(self) -> LiveTables:
        """The live tables of the episode's step and regime (built once per process, step and regime:
        ``_SHARED_TABLES``), with this environment's own observation and advice buffers."""
        key = (id(self._plans), self.latency_s, self.latency_std_s, self.decision_interval_s)
        if self._tables is None or key != self._tables_key:
            found = _SHARED_TABLES.get(key)
            if found is None or found[0] is not self._plans:
                found = _SHARED_TABLES[key] = (self._plans, self.live_tables())
            self._tables_key, self._tables = key, replace(found[1], obs=self._obs, advice=self._advice)
        return self._tables

    def _observe_policy(self) -> Array:
        """Measure, write the policy's observation and the standing order's pair at this decision point."""
        self._state = self.measured_state()
        margin = MARGINS[min(int(self._action[2]), len(MARGINS) - 1)]
        fitting = residual_observation(self._policy_obs, self.tables(), self._state, self.budget, self._budget_plan,
                                       margin, self.measurement.errors)
        levels, memories = self.grid.levels, self._memories
        self._pair = residual_pair(fitting, CORE_STEPS[int(self._action[0])], MEMORY_STEPS[int(self._action[1])],
                                   levels, memories)
        return self._policy_obs.copy()

    def step(self, action: Array) -> tuple[Array, float, bool, bool, dict[str, Any]]:
        """Set the standing order ``action`` and run to the next decision (module docstring)."""
        if self._k >= self._kernels:
            raise gym.error.ResetNeeded("the step is over; call reset()")
        before = self._totals()
        self._action = np.asarray(action, dtype=np.int64)
        _, error = budget_use(self._state)
        self.measurement.record_error(100.0 * error)
        if int(self._action[2]) == RELEASE:
            self._release()
            reward, info = self._reward(before, True)
            return self._policy_obs.copy(), reward, True, False, info
        self._observe_policy()  # the new standing order's pair here
        while True:
            self._request_pair(self._pair)
            self._advance(self._now_s + self.decision_interval_s)
            if self._k == self._kernels:
                break
            self._observe_policy()
            if self._boundary():
                break
        terminated = self._k == self._kernels
        reward, info = self._reward(before, terminated)
        return self._policy_obs.copy(), reward, terminated, False, info

    def _release(self) -> None:
        """Auto clocks requested as soon as the controller is free (at once at the step's start), then the run to
        its end with no other request."""
        while self._k < self._kernels:
            self._request_pair(0)
            self._advance(self._now_s + self.decision_interval_s)

    def _boundary(self) -> bool:
        """Whether the agent decides here: the order asks for another pair and the controller is free, or the
        run's progress passed a budget event."""
        if self.config.budget_events and self._auto_progress() >= self._next_event / self.config.budget_events - EPS:
            self._next_event = int(self._auto_progress() * self.config.budget_events) + 1
            return True
        return self._pending < 0 and self._pair != self._in_effect

    def _auto_progress(self) -> float:
        """The share of the run's predicted auto time before the kernel the controller places the GPU at."""
        return self._state.auto_elapsed_s / self._auto_time_s

    def _request_pair(self, pair: int) -> None:
        """Request ``pair`` (at the first decision it is in effect from the start; later only when the
        controller is free and it differs from the pair in effect)."""
        if self._k == 0:
            self._in_effect = pair
            self.measurement.landed(0.0, pair, 0.0)
        elif self._pending < 0 and pair != self._in_effect:
            self._pending, self._requested_at_s = pair, self._now_s
            self._effective_at_s = self._now_s + self.disturbances.latency(self._requests)
            self._requests += 1

    def _reward(self, before: Any, terminated: bool) -> tuple[float, dict[str, Any]]:
        """Energy saved since ``before`` and, at the end, the overrun and violation terms (module docstring)."""
        after = self._totals()
        energy = 100.0 * ((after.auto_energy_j - before.auto_energy_j) - (after.energy_j - before.energy_j)) \
            / self._reference.step_auto_energy_j
        info: dict[str, Any] = {"reward_energy": energy, "reward_time": 0.0, "reward_violation": 0.0,
                                "budget": self.budget, "latency_scale": self.config.latency_scales[self.selection[1]],
                                "violation": 0.0}
        if terminated:
            summary = self.episode_summary()
            over_pct = max(0.0, summary["slowdown_pct"] - 100.0 * self.budget)
            violated = float(over_pct > VIOLATION_TOLERANCE_PCT)
            info.update(summary, reward_time=-self.config.overrun_penalty * over_pct, violation=violated,
                        reward_violation=-self.config.violation_penalty * violated)
        return energy + info["reward_time"] + info["reward_violation"], info


VIOLATION_TOLERANCE_PCT = 1e-6
"""Slowdown beyond the budget that still counts as within it (%; :data:`kdvfs.agents.common.problem`'s
tolerance for the same check)."""
