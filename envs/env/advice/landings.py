"""Where requests land on each pair's timeline, and where each plan's proposal changes there, for one step and
switching regime of ``KernelDVFS-v0``.

Every observation reads the landing kernels of the pair in effect (the plan advisors' proposals are the pairs
where a request made now lands); a live decision also reads where the standing order's plan next proposes
another pair. :class:`Landings` computes each on first use, per pair (and plan), into one array
(:attr:`Landings.rows`) while episodes run the same step and regime, and all of them at once for a controller
(:meth:`Landings.table`: the arrays of :class:`~kdvfs.envs.env.observing.live_tables.LiveTables`), so that no live
decision computes one.
"""

from __future__ import annotations

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.envs.env.advice.plan_advice import PlanAdvice, landing_kernels
from kdvfs.envs.env.steps.step_data import StepData


class Landings:
    """Landing kernels and proposal changes of one step's run (``data``, its plan advice ``plans``) under one
    switching regime (mean latency, its spread, the decision interval; s).

    Attributes:
        rows: (G, 2, K + 1) int64 landing kernels (earliest, next) on the timeline of each pair in effect; a
            pair's row holds them once :meth:`of` (or :meth:`table`) computed them, and is undefined before.
    """

    def __init__(self, data: StepData, plans: PlanAdvice, latency_s: float, latency_std_s: float,
                 decision_interval_s: float) -> None:
        self._data, self._plans = data, plans
        self._timing = (latency_s, latency_std_s, decision_interval_s)
        self.rows = np.empty((data.cumulative.shape[2], 2, data.kernels + 1), dtype=np.int64)
        self._computed = np.zeros(data.cumulative.shape[2], dtype=bool)
        self._proposals: dict[tuple[int, int], Array] = {}

    def of(self, pair: int) -> tuple[Array, Array]:
        """:func:`~kdvfs.envs.env.advice.plan_advice.landing_kernels` on the timeline of ``pair`` in effect (mean
        times): (K + 1,) int64 each (views of :attr:`rows`)."""
        if not self._computed[pair]:
            self.rows[pair] = landing_kernels(self._data.cumulative_of(pair)[0], *self._timing)
            self._computed[pair] = True
        return self.rows[pair, 0], self.rows[pair, 1]

    def proposal_changes(self, pair: int, plan: int) -> Array:
        """:meth:`~kdvfs.envs.env.advice.plan_advice.PlanAdvice.proposal_changes` of ``plan`` with ``pair`` in effect
        (sorted kernels)."""
        key = (pair, plan)
        changes = self._proposals.get(key)
        if changes is None:
            changes = self._proposals[key] = self._plans.proposal_changes(plan, *self.of(pair))
        return changes

    def table(self) -> tuple[Array, Array, Array]:
        """Every pair's and plan's, computed now where not yet: (G, 2, K + 1) int64 landing kernels (earliest,
        next) per pair in effect; (G * P + 1,) int64 offsets where (pair, plan)'s proposal changes start (at
        ``pair * P + plan``) in the third, their concatenation (empty without plans)."""
        pairs, plans = range(self._data.cumulative.shape[2]), range(self._plans.pairs.shape[1])
        for pair in pairs:
            if any((pair, plan) not in self._proposals for plan in plans):  # every plan's in one pass
                for plan, found in enumerate(self._plans.every_proposal_changes(*self.of(pair))):
                    self._proposals.setdefault((pair, plan), found)
        changes = [self.proposal_changes(pair, plan) for pair in pairs for plan in plans]
        offsets = np.zeros(len(changes) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(c) for c in changes])
        return self.rows, offsets, np.concatenate([np.zeros(0, dtype=np.int64), *changes]).astype(np.int64)
