"""How ``KernelDVFS-v0`` runs a step between decision points: kernels at the clocks in effect, a pending
request landing at the first kernel that starts at or after its effective time (one switching latency after
it was issued), each change stalling the GPU, and the episode's time and energy (its own and auto's over the
same kernels) accumulated as it goes.

:class:`StepExecution` holds that state for :class:`~kdvfs.envs.env.dvfs_env.KernelDVFSEnv`, which sets it at
each episode's start (``_select``), issues requests and observes it.
"""

from __future__ import annotations

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.envs.env.advice.plan_advice import EPS
from kdvfs.envs.env.dynamics import Disturbances
from kdvfs.envs.env.reward import Totals
from kdvfs.envs.env.steps.step_data import StepData


class StepExecution:
    """The execution state of one episode's run and the methods that advance it.

    Attributes (set by the environment at each episode's start):
        _data: the run (the drawn step repeated ``run_steps`` times), K kernels (``_kernels``): what the
            controller expects and observes.
        _executed: the run the GPU executes: ``_data`` itself, or another step mapped onto its K kernels
            (:meth:`~kdvfs.envs.env.steps.step_data.StepData.executed_as`: a step of another shape than predicted).
        disturbances: the episode's draws; latency_s, stall_s: mean switching latency and stall per change (s).
        _memories: memory clocks of the grid (actions below it are auto core levels); _core_fraction: (G,) each
            grid action's core clock as a fraction of the maximum.
        _k: the current kernel; _in_effect, _pending: grid actions in effect and pending (-1: none).
        _requested_at_s, _effective_at_s: when the pending request was issued and takes effect (s).
        _now_s, _elapsed_s, _auto_elapsed_s: the model's clock, the run's time and auto's over the same
            kernels (s); _energy_j, _auto_energy_so_far_j: the same in joules.
        _model_elapsed_s: what ``_data`` (the prediction) says the kernels run take at the clocks they ran at,
            stalls included (s, no disturbances): what a controller can compare its elapsed time with.
        _switches, _requests: changes that landed, requests issued; applied: (K,) the clocks each kernel ran at.
        _columns: cumulative (time, energy) per grid action under the episode's disturbances, filled on use.
    """

    _data: StepData
    _executed: StepData
    _kernels: int
    _memories: int
    _core_fraction: Array
    disturbances: Disturbances
    latency_s: float
    stall_s: float
    _k: int
    _in_effect: int
    _pending: int
    _requested_at_s: float
    _effective_at_s: float
    _last_latency_ratio: float
    _now_s: float
    _elapsed_s: float
    _auto_elapsed_s: float
    _model_elapsed_s: float
    _energy_j: float
    _auto_energy_so_far_j: float
    _switches: int
    _requests: int
    applied: np.ndarray
    _columns: dict[int, tuple[Array, Array]]

    def _totals(self) -> Totals:
        return Totals(self._energy_j, self._auto_energy_so_far_j, self._elapsed_s, self._auto_elapsed_s)

    def _advance(self, deadline_s: float) -> None:
        """Run kernels up to the next decision point: the first kernel starting at or after ``deadline_s``
        (at least one kernel); a pending change takes effect at the first kernel starting at or after its
        effective time, with its stall."""
        ran = False
        while self._k < self._kernels:
            if self._pending >= 0 and self._effective_at_s <= self._now_s + EPS:
                self._apply_pending()
                if ran:
                    return
            if ran and self._now_s >= deadline_s - EPS:
                return
            limit_s = deadline_s if self._pending < 0 else min(deadline_s, self._effective_at_s)
            self._run_until(limit_s)
            ran = True

    def _apply_pending(self) -> None:
        if self.latency_s > 0:
            self._last_latency_ratio = (self._now_s - self._requested_at_s) / self.latency_s
        self._in_effect, self._pending = self._pending, -1
        self._switches += 1
        self._elapsed_s += self.stall_s
        self._model_elapsed_s += self.stall_s
        self._energy_j += self.stall_s * float(self._data.idle_power_w[self._in_effect])

    def _run_until(self, limit_s: float) -> None:
        """Run the kernels from the current one (at least it) up to the first starting at or after ``limit_s``,
        at the clocks in effect."""
        k, g = self._k, self._in_effect
        times, energies = self._column(g)
        auto_times, auto_energies = self._column(0)
        end = int(times.searchsorted(times[k] + (limit_s - self._now_s) - EPS, side="left"))
        end = min(max(end, k + 1), self._kernels)
        time_s = float(times[end] - times[k])
        self._now_s += time_s
        self._elapsed_s += time_s
        self._energy_j += float(energies[end] - energies[k])
        self._auto_elapsed_s += float(auto_times[end] - auto_times[k])
        predicted = self._data.cumulative[:, 0, g]
        self._model_elapsed_s += float(predicted[end] - predicted[k])
        self._auto_energy_so_far_j += float(auto_energies[end] - auto_energies[k])
        self.applied[k:end] = self._data.actions[g]
        self._k = end

    def _column(self, action: int) -> tuple[Array, Array]:
        """Cumulative time and energy at ``action`` with this episode's disturbances (computed on first use)."""
        column = self._columns.get(action)
        if column is None:
            drawn = self.disturbances
            if action < self._memories:
                time_factor = drawn.time_auto
            else:
                locked = drawn.locked_factors(self._core_fraction[action: action + 1])
                time_factor = None if locked is None else locked[:, 0]
            column = self._columns[action] = self._executed.cumulative_of(action, time_factor, drawn.energy)
        return column
