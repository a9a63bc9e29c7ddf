"""A frozen policy deciding online, inside a running step, on what a controller measured.

:class:`OnlinePolicy` holds the policy's environment for the problem's step (:func:`policy_env`) and, at each
live decision point, turns the measured :class:`~kdvfs.envs.env.observing.live.LiveState` into the observation
(:func:`~kdvfs.envs.env.observing.live_tables.observe_at`, the environment's own) and the pair to request, in one
compiled call (:mod:`kdvfs.agents.learned.policy.live_decision`). As in the environment the policy runs when its
last choice has held for ``decision_fraction`` of the step's auto time; in between its standing order ("follow
plan p") is re-read. Each decision says when the next is needed: when the policy runs again and the kernel
where the order's proposal can next change (unknown for the fitting plan, which depends on the budget: a
controller reads it ahead with :meth:`OnlinePolicy.first_change`). Times are on the model timeline (s).
Not for concurrent use; :meth:`OnlinePolicy.prepare` computes every table before the first step. Why a
decision is split this way: ``docs/learning.md`` (online decisions).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.policy.frozen import FrozenPolicy, PolicyFileError
from kdvfs.agents.learned.policy.live_decision import (
    NO_REQUEST,
    O_BUDGET,
    O_ENTRIES,
    O_IN_EFFECT_ROWS,
    O_PENDING_ROWS,
    BoundDecision,
    decide_bound,
    first_change_bound,
)
from kdvfs.agents.learned.policy.policy_planner import policy_env
from kdvfs.common.locked import index_right
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.observing.dynamic_observation import clock_one_hots
from kdvfs.envs.env.observing.live import LiveState
from kdvfs.envs.env.observing.live_tables import DEPENDS_ON_BUDGET
from kdvfs.envs.env.observing.measured import RESIDUAL_OBSERVATION_VERSION

_decide: Callable[..., tuple[int, int, float, float]] = decide_bound
"""The compiled decision, called with its bound arrays, the budget and the state splatted (typed for that
call)."""
_first_change: Callable[..., int] = first_change_bound


DUE_TOLERANCE_S = 1e-6
"""A decision whose due time is this close ahead counts as due (s): a controller that slept until the due time
converts it to host time and back, and the rounding can land it a hair short of it (one microsecond is far
below any decision interval)."""


class OnlineDecision(NamedTuple):
    """One live decision: the grid pair to request (``NO_REQUEST``: keep the clocks), whether the policy ran
    (else its standing order was re-read), its action, and the observation's budget figures (used share of
    the budget, slowdown still affordable over the rest of the step, %); and when the next decision is needed:
    ``next_change`` the kernel where the standing order's proposal can next differ (K: never; None: it
    depends on the budget, ask again soon) and ``policy_due_s`` when the policy runs again (s from the step's
    start, model timeline)."""

    pair: int
    evaluated: bool
    action: tuple[int, ...]
    budget_used: float
    affordable_pct: float
    next_change: int | None
    policy_due_s: float


class OnlinePolicy:
    """See the module docstring. Not for concurrent use (the policy and the env work in buffers).

    Attributes:
        labels: each grid pair's clock label (``"1410:3201"``) on the problem's costs.
        auto_time_s: the step's auto time on the model timeline (s).
        decision_interval_s: the environment's least time between decision points (s, model timeline).
        latency_std_s: the switching latency's spread the policy's environment assumes (s).
        elapsed_factors: None: the controller's ``PredictedElapsed`` counts the prediction's times as they are.
    """

    elapsed_factors: np.ndarray | None = None

    def __init__(self, policy: FrozenPolicy, problem: Problem, env: KernelDVFSEnv | None = None) -> None:
        """``env``: the policy's :func:`policy_env` of ``problem`` when already built (seconds for a
        2,000-kernel step), else built here.

        Raises:
            PolicyFileError: a residual policy (``KernelDVFSResidual-v0``), which
                :class:`~kdvfs.agents.learned.policy.residual_online.ResidualOnlinePolicy` runs
                (:func:`~kdvfs.agents.learned.policy.deciders.online_decider` picks).
        """
        if policy.config.residual_actions:
            raise PolicyFileError(f"a residual policy (observation v{RESIDUAL_OBSERVATION_VERSION}) runs online in "
                                  "ResidualOnlinePolicy, not OnlinePolicy")
        self.policy = policy
        self.env = policy_env(policy, problem) if env is None else env
        step = self.env.steps[0]
        self.cumulative_s = step.cumulative[:, 0, :]
        self.labels = tuple(problem.costs.label(int(a)) for a in step.actions)
        self.auto_time_s = step.auto_time_s
        self.decision_interval_s, self.latency_std_s = self.env.decision_interval_s, self.env.latency_std_s
        self._hold_s = policy.config.decision_fraction * step.auto_time_s
        spec = self.env.observation_spec
        self._static_size = static_size = spec.static_size
        budget, in_effect, pending = spec.span("budget"), spec.span("clocks_in_effect"), spec.span("clocks_pending")
        assert in_effect.start == static_size and pending.start == in_effect.stop, "clock blocks follow the static part"
        self._tail = pending.stop - static_size
        clocks = clock_one_hots(spec.grid.levels, len(spec.grid.memory_mhz))
        firsts = policy.first_products(self.env.static_rows, 0, static_size)
        self._products = np.vstack([firsts, policy.first_products(clocks, in_effect.start, in_effect.stop),
                                    policy.first_products(clocks, pending.start, pending.stop)])
        self._in_effect_row = len(firsts) + 1  # + the pair in effect
        self._pending_row = len(firsts) + len(clocks) + 1  # + the pair pending (-1: none)
        self._offsets = np.zeros(4, dtype=np.int64)
        self._offsets[[O_ENTRIES, O_IN_EFFECT_ROWS, O_PENDING_ROWS, O_BUDGET]] = (
            pending.stop, self._in_effect_row, self._pending_row, budget.start)
        self._forward = policy.forward_inputs(pending.stop)
        self._picks = np.zeros(3, dtype=np.int64)
        self._action = np.zeros(len(policy.nvec), dtype=np.int64)
        """The standing order (the action the policy last chose), written in place by each evaluation."""
        self._throwaway_action = np.zeros_like(self._action)
        """:meth:`warm`'s action, written in place and dropped."""
        self._begun = False
        self._bound: tuple[BoundDecision, BoundDecision] | None = None
        """The decisions' arrays, bound: for the standing order, and for :meth:`warm`'s throwaway action."""
        self._bound_for: tuple[int, int] | None = None
        """The env's step and regime whose arrays are bound."""
        self._budget = (0.0, -1)
        self._hold_until_s = -math.inf
        self._began: tuple[float, np.ndarray, tuple[float, int], int] | None = None
        """The last :meth:`begin`'s budget and what it found: the first action, the env's budget and budget plan,
        and the first pair."""

    def prepare(self) -> None:
        """Compute now what the first decisions at each pair in effect would compute, and the arrays every
        decision reads (:meth:`~kdvfs.envs.env.dvfs_env.KernelDVFSEnv.live_tables`); whoever decides calls it
        once, before the first :meth:`begin` (else the first :meth:`begin` does; a controller that decides in a
        child process needs only the rest). It also runs the first pair's policy, a throwaway decision and a
        look-ahead, so that their compiled code is compiled (or loaded from numba's cache) here, not in a
        controlled step."""
        observation, _ = self.env.reset(seed=0)
        self._began = None
        self._policy_action(observation[self._static_size:])
        self._bind()
        self.warm(LiveState(0, 0, NO_REQUEST, 0.0, 0.0, 0.0))
        times_s = np.zeros(1)
        self.first_change(np.zeros(1, dtype=np.int64), 0, times_s, times_s, 1.0, 0.0, times_s)

    def _bind(self) -> None:
        """Bind the decisions' arrays (the env's live tables for its step, the policy's)."""
        tables = (*self.env.live_tables().arrays(), *self._forward, self._products, self._offsets)
        self._bound = (BoundDecision(*tables, self._action, self._picks),
                       BoundDecision(*tables, self._throwaway_action, self._picks))
        self._bound_for = self.env.selection

    def pair_of(self, label: str) -> int:
        """The grid pair of clock label ``label``; ValueError if the grid has none."""
        return self.labels.index(label)

    def begin(self, budget: float) -> int:
        """Start a step with ``budget`` (allowed step-time increase over auto, a fraction); returns its first
        pair (at kernel 0). The env's first decision is a function of the budget alone (its reset is seeded, and
        every decision writes the observation anew), so a step with the last step's budget reuses it."""
        budget = max(0.0, budget)
        if self._began is None or self._began[0] != budget:
            observation, _ = self.env.reset(seed=0, options={"budget": budget})
            action = self._policy_action(observation[self._static_size:])
            pair = self.env.target_pair(action) if action[0] else 0
            self._began = (budget, action.copy(), (self.env.budget, self.env.budget_plan), pair)
            if self._bound_for != self.env.selection:  # not bound yet, or the env now runs another step or regime
                self._bind()
        _, action, self._budget, pair = self._began
        self._action[:] = action
        self._hold_until_s, self._begun = self._hold_s, True
        return pair

    def decide(self, state: LiveState, now_s: float) -> OnlineDecision:
        """The decision at ``state``, ``now_s`` after the step's start (s, model timeline), in one compiled call
        (:func:`~kdvfs.agents.learned.policy.live_decision.decide_bound`); after :meth:`begin`."""
        assert self._begun and self._bound is not None, "begin a step first"
        evaluated = now_s >= self._hold_until_s - DUE_TOLERANCE_S
        if evaluated:
            self._hold_until_s = now_s + self._hold_s
        return self._decision(self._bound[0], self._action, state, evaluated)

    def first_change(self, kernels: np.ndarray, in_effect: int, elapsed_s: np.ndarray, auto_elapsed_s: np.ndarray,
                     last_latency_ratio: float, drift_pct: float, model_elapsed_s: np.ndarray) -> int:
        """The first of the states ahead at which the standing order (its proposal depending on the budget) would
        name a pair other than ``in_effect`` (n: none), in one compiled call
        (:func:`~kdvfs.agents.learned.policy.live_decision.first_change_bound`): ``kernels`` (n,) int64 and the times
        (n,) (s, model timeline) of :class:`~kdvfs.envs.env.observing.live.LiveState`, with no change pending; after
        :meth:`begin`. The standing order and its hold are unchanged. ``last_latency_ratio`` and ``drift_pct`` are
        the controller's interface's (a residual policy's look-ahead reads them); the plans' proposals do not."""
        assert self._bound is not None, "begin a step first"
        return _first_change(self._bound[0], *self._budget, kernels, in_effect, elapsed_s, auto_elapsed_s,
                             model_elapsed_s)

    def warm(self, state: LiveState) -> None:
        """Run a decision at ``state`` (the observation, the policy, the decision's making) and drop its result:
        the standing order, its hold and every later decision are as without it (each decision writes the
        observation anew). A controller thread that slept calls it shortly before a decision is due, so that the
        decision runs on a warm core (its code and data: the same calls as :meth:`decide`'s); after
        :meth:`begin`."""
        assert self._bound is not None, "begin a step first"
        self._decision(self._bound[1], self._throwaway_action, state, True)

    def _decision(self, bound: BoundDecision, action: np.ndarray, state: LiveState, evaluated: bool
                  ) -> OnlineDecision:
        """The decision at ``state`` on ``bound`` (whose action buffer is ``action``)."""
        pair, change, used, affordable = _decide(bound, *self._budget, *state, evaluated)
        return OnlineDecision(pair, evaluated, tuple(action.tolist()), used, affordable,
                              None if change == DEPENDS_ON_BUDGET else change, self._hold_until_s)

    def _policy_action(self, rest: np.ndarray) -> np.ndarray:
        """The policy's action at the env's decision point, whose observation past its static part is ``rest``:
        the first layer's share of the static part and of the clock blocks are rows computed ahead (for every
        kernel, pair in effect and pair pending), the rest is multiplied now."""
        kernel, in_effect, pending = self.env.clocks
        picks = self._picks
        picks[0], picks[1], picks[2] = kernel, self._in_effect_row + in_effect, self._pending_row + pending
        return self.policy.act_from(self._products, picks, rest[self._tail:])


def kernel_at(times_s: Sequence[float], from_kernel: int, offset_s: float) -> int:
    """The kernel running ``offset_s`` (s) after kernel ``from_kernel`` started, on the timeline ``times_s``
    ((K+1,) kernel starts, the last the step's end); never before ``from_kernel`` nor past the last kernel."""
    index = index_right(times_s, times_s[from_kernel] + offset_s) - 1
    return min(max(index, from_kernel), len(times_s) - 2)
