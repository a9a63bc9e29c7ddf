"""A classic reactive DVFS governor: it looks at the SM utilisation of what just ran and sets the clock for
what comes next, with the switching latency in between. It knows nothing ahead of time."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from kdvfs.agents.common.problem import Problem
from kdvfs.envs.model.schedule import Schedule


@dataclass
class ReactiveGovernor:
    """Utilisation-threshold governor.

    Every ``period_s`` (at least the switching latency), it averages the SM utilisation of the kernels that
    ran in the last period (time-weighted) and requests auto above ``high_util``, a core clock of
    ``low_fraction`` x max below ``low_util``, and ``mid_fraction`` x max in between (memory clock at its
    default); a request takes effect one switching latency later.
    """

    name: str = "reactive"
    period_s: float = 0.001
    low_util: float = 0.3
    high_util: float = 0.6
    low_fraction: float = 0.65
    mid_fraction: float = 0.8

    def _levels(self, problem: Problem) -> tuple[int, int, int]:
        costs, clocks = problem.costs, problem.profile.clocks
        cores = np.asarray(clocks.core_mhz[clocks.default_memory_mhz], dtype=np.float64)

        def locked(fraction: float) -> int:
            core = cores[np.argmin(np.abs(cores - fraction * clocks.max_core_mhz))]
            return costs.index_of(f"{core:g}:{clocks.default_memory_mhz:g}")

        return locked(self.low_fraction), locked(self.mid_fraction), costs.auto_index

    def plan(self, problem: Problem) -> Schedule:
        start = time.perf_counter()
        low, mid, high = self._levels(problem)
        costs, utilisation = problem.costs, np.asarray(problem.trace.sm_util)
        period = max(self.period_s, problem.latency_s)
        applied = np.empty(costs.kernels, dtype=np.int64)
        in_effect, pending, pending_at = high, high, -1.0
        now, next_decision, busy_util, busy_s = 0.0, period, 0.0, 0.0
        for kernel in range(costs.kernels):
            if pending_at >= 0 and now >= pending_at:
                in_effect, pending_at = pending, -1.0
            applied[kernel] = in_effect
            duration = costs.time_s[kernel, in_effect]
            now, busy_util, busy_s = now + duration, busy_util + utilisation[kernel] * duration, busy_s + duration
            if now >= next_decision:
                average = busy_util / busy_s
                pending = high if average > self.high_util else low if average < self.low_util else mid
                pending_at = now + problem.latency_s if pending != in_effect else -1.0
                next_decision, busy_util, busy_s = now + period, 0.0, 0.0
        return Schedule(applied, self.name, time.perf_counter() - start, reactive=True)
