"""A residual policy (``KernelDVFSResidual-v0``) deciding online, inside a running step, on what a controller measured.

:class:`ResidualOnlinePolicy` has :class:`~kdvfs.agents.learned.policy.online.OnlinePolicy`'s interface
(:class:`~kdvfs.agents.learned.policy.deciders.OnlineDecider`), so the controller runs it unchanged. At each
decision point it turns the controller's :class:`~kdvfs.envs.env.observing.live.LiveState` into the
:class:`~kdvfs.envs.env.observing.measured.MeasuredState` the residual environment builds from its simulation
(:func:`~kdvfs.agents.learned.policy.residual_decision.host_times`: host seconds; the prediction's time at the
clocks run with the measured drift, which the controller counts with :attr:`elapsed_factors`)
and computes the observation with the environment's own function,
:func:`~kdvfs.envs.env.observing.measured.residual_observation` (compiled: the decisions, their look-ahead and
their policy runs are each one compiled call, :mod:`~kdvfs.agents.learned.policy.residual_decision`). It decides
where :class:`~kdvfs.envs.env.residual_env.ResidualDVFSEnv` does: at the step's start (:meth:`begin`), where the
standing order names another pair and no change is pending (a segment boundary the controller acts on), and
where the run's position passes another ``1 / budget_events`` of its auto time (a budget event); elsewhere the
standing order's pair is re-read. The release (``RELEASE``) names auto until it is in effect, then nothing for
the rest of the step. Times are on the model timeline (s) unless named host. Not for concurrent use.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.policy.frozen import FrozenPolicy, PolicyFileError
from kdvfs.agents.learned.policy.live_decision import NO_REQUEST
from kdvfs.agents.learned.policy.online import OnlineDecision
from kdvfs.agents.learned.policy.policy_planner import policy_env
from kdvfs.agents.learned.policy.residual_decision import (
    RELEASED,
    BoundResidual,
    begin_bound,
    decide_residual,
    first_change_residual,
    warm_residual,
)
from kdvfs.envs.env.advice.plan_advice import plan_for_budget
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.observing.live import LiveState
from kdvfs.envs.env.observing.measured import (
    CORE_STEPS,
    ERROR_HISTORY,
    FEATURES,
    MARGINS,
    MEMORY_STEPS,
    drift_factors,
)
from kdvfs.envs.env.residual_env import ResidualDVFSEnv

USED, AFFORDABLE = FEATURES.index("budget_used"), FEATURES.index("affordable_pct")


class ResidualOnlinePolicy:
    """See the module docstring.

    Attributes:
        labels: each grid pair's clock label on the problem's costs (pair 0: auto).
        cumulative_s: (K + 1, G) the prediction's start of each kernel at each pair (s).
        auto_time_s: the step's auto time (s).
        decision_interval_s: the environment's least time between decision points (s).
        latency_std_s: the switching latency's spread the policy's environment assumes (s).
        elapsed_factors: (G,) each pair's factor on the prediction's time at the measured drift
            (:func:`~kdvfs.envs.env.observing.measured.drift_factors`), updated in place at each decision: the
            controller's :class:`~kdvfs.envs.env.observing.live.PredictedElapsed` reads it.
        acted_on: (the observation's size,) float32, the observation the policy last ran on.
    """

    def __init__(self, policy: FrozenPolicy, problem: Problem, env: KernelDVFSEnv | None = None) -> None:
        """``env``: the policy's :func:`policy_env` of ``problem`` when already built, else built here.

        Raises:
            PolicyFileError: not a residual policy.
        """
        if not policy.config.residual_actions:
            raise PolicyFileError("not a residual policy (KernelDVFSResidual-v0); OnlinePolicy runs it")
        self.policy = policy
        self.env = cast(ResidualDVFSEnv, policy_env(policy, problem) if env is None else env)
        step = self.env.steps[0]
        self.cumulative_s = step.cumulative[:, 0, :]
        self.labels = tuple(problem.costs.label(int(a)) for a in step.actions)
        self.auto_time_s = step.auto_time_s
        self.decision_interval_s, self.latency_std_s = self.env.decision_interval_s, self.env.latency_std_s
        self._memories = len(self.env.grid.memory_mhz)
        self._drift_pct = 0.0
        self.elapsed_factors = drift_factors(self.env.grid.size, 0.0)
        self._obs = np.zeros(self.env.policy_spec.size, dtype=np.float32)
        self.acted_on = np.zeros_like(self._obs)
        self._action = np.zeros(3, dtype=np.int64)
        self._counters = np.zeros(2, dtype=np.int64)
        self._budget, self._budget_plan = 0.0, -2
        """The last step's budget and its plan (:func:`plan_for_budget`; -2: none yet)."""
        self._bound: BoundResidual | None = None

    def prepare(self) -> None:
        """Bind the decisions' arrays (the live tables: every pair's landings and proposal changes; the policy's)
        and run a throwaway step's first decisions (its start, a warm-up, a look-ahead and a decision), so that
        nothing is computed or compiled (or loaded from numba's cache) for the first time in a controlled step;
        the next :meth:`begin` starts the step's state afresh."""
        self.env.reset(seed=0)
        tables = self.env.tables()
        first, mean, inverse_std, clip, later, bounds, activation = self.policy.forward_inputs(0)
        self._bound = BoundResidual(
            self._obs, self.acted_on, np.zeros_like(self._obs), np.zeros(ERROR_HISTORY), self._action, self._counters,
            tables.obs, tables.advice, tables.static_rows, tables.layout, tables.advisor_index, tables.cumulative_s,
            tables.landings, tables.plan_pairs, tables.plan_rest, tables.joinable, tables.next_change,
            tables.speeds_up, tables.sizes, tables.auto_time_s, tables.latency_s, tables.stall_s,
            np.array(MARGINS), np.array(CORE_STEPS, dtype=np.int64), np.array(MEMORY_STEPS, dtype=np.int64),
            self.env.grid.levels, self._memories, self.env.config.budget_events, self.auto_time_s,
            first, mean, inverse_std, clip, np.zeros((1, len(first[1])), dtype=np.float32),
            np.zeros(1, dtype=np.int64), later, bounds, activation)
        self.begin(0.0)
        self.warm(LiveState(0, 0, NO_REQUEST, 0.0, 0.0, 0.0))
        times_s = np.zeros(1)
        self.first_change(np.zeros(1, dtype=np.int64), 0, times_s, times_s, 1.0, 0.0, times_s)
        self.decide(LiveState(0, 0, NO_REQUEST, 0.0, 0.0, 0.0), 0.0)

    def pair_of(self, label: str) -> int:
        """The grid pair of clock label ``label``; ValueError if the grid has none."""
        return self.labels.index(label)

    def begin(self, budget: float) -> int:
        """Start a step with ``budget`` (allowed step-time increase over auto, a fraction): no errors measured,
        the first budget event next, the policy's first decision at kernel 0 (auto in effect, the drift of the
        last decision); returns its pair (pair 0, auto, for a release)."""
        if self._bound is None:
            self.prepare()
        if max(0.0, budget) != self._budget or self._budget_plan < -1:  # the last step's budget: its plan
            self._budget = max(0.0, budget)
            self._budget_plan = plan_for_budget(self.env.observation_spec.plan_budgets, self._budget)
        return int(begin_bound(self._bound, self._budget, self._budget_plan, self._drift_pct))

    def decide(self, state: LiveState, now_s: float) -> OnlineDecision:
        """The decision at ``state``, ``now_s`` after the step's start, in one compiled call
        (:func:`~kdvfs.agents.learned.policy.residual_decision.decide_residual`); after :meth:`begin`. The policy
        runs at a budget event or where the standing order names another pair with none pending; the next
        decision is due where :meth:`first_change` finds one (``next_change`` None; ``policy_due_s`` never); a
        released step names auto (the controller requests it once the clocks are free) and wakes for nothing
        more."""
        self.follow_drift(state.auto_drift_pct)
        pair, evaluated = decide_residual(self._bound, self._budget, self._budget_plan, *state)
        obs = self._obs
        return OnlineDecision(pair, evaluated, tuple(self._action.tolist()), float(obs[USED]), float(obs[AFFORDABLE]),
                              len(self.cumulative_s) - 1 if self._counters[RELEASED] else None, math.inf)

    def warm(self, state: LiveState) -> None:
        """Run a decision's observation and policy at ``state`` and drop the result (nothing of the step's
        decisions changes); after :meth:`begin`."""
        warm_residual(self._bound, self._budget, self._budget_plan, *state)

    def first_change(self, kernels: np.ndarray, in_effect: int, elapsed_s: np.ndarray, auto_elapsed_s: np.ndarray,
                     last_latency_ratio: float, drift_pct: float, model_elapsed_s: np.ndarray) -> int:
        """The first of the states ahead (``kernels`` (n,) and their times (n,), the fields of
        :class:`~kdvfs.envs.env.observing.live.LiveState`, nothing pending) at which a decision is due: the
        position passes the next budget event or the standing order names a pair other than ``in_effect`` (n:
        none, or released), in one compiled call; the step's decisions are unchanged."""
        return int(first_change_residual(self._bound, self._budget, self._budget_plan, kernels, in_effect, elapsed_s,
                                         auto_elapsed_s, last_latency_ratio, drift_pct, model_elapsed_s))

    def follow_drift(self, drift_pct: float) -> None:
        """Take ``drift_pct`` (%) as auto's measured drift: :attr:`elapsed_factors` (in place) and the next
        :meth:`begin`'s (each decision takes its state's)."""
        if drift_pct != self._drift_pct:
            self._drift_pct = drift_pct
            self.elapsed_factors[:] = drift_factors(self.env.grid.size, drift_pct)
