"""Clock actions, schedules, and executing a schedule on the cost model with switching latency.

An *action* is what a controller can request for a kernel: one of the N supported (core, memory) pairs
locked, or one of the M memory clocks with the core clock left to the firmware ("auto"). A *schedule*
assigns an action to every kernel of a step. Executing it (:func:`execute`) applies the profile's
switching semantics, shared by the planners, the environment and the fake GPU:

* a controller issues a clock request ahead of the kernel that needs it, aimed so that the change takes
  effect when that kernel starts; one request occupies the controller for the switching latency, so
  requests are at least one latency apart, and a request that cannot be issued early enough takes
  effect late;
* a kernel runs at the clocks in effect when it starts; the idle gap before it at the same clocks;
* every change that takes effect stalls the GPU for ``switch_stall_s`` at idle power;
* a step starts with its first kernel's clocks in effect: the change back from the previous step's last
  clocks, if any, is issued during the step boundary's host work and is not charged (one stall per step
  at most; planners keep every segment, first and last included, at least a latency long so that it too
  is a latency away from its neighbours).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.envs.model.cost_tables import CostTables


@dataclass(frozen=True)
class ActionCosts:
    """Per-kernel time and energy of every action, the preceding idle gap included. K kernels, A actions.

    Attributes:
        time_s: (K, A) kernel plus preceding gap (s).
        energy_j: (K, A) kernel plus preceding gap (J).
        core_mhz: (A,) locked core clock, NaN for auto.
        mem_mhz: (A,) memory clock.
        auto_index: the action of the GPU's default behaviour (auto at the highest memory clock).
        idle_power_w: (A,) power while stalled for a switch at each action's clocks (W).
    """

    time_s: Array
    energy_j: Array
    core_mhz: Array
    mem_mhz: Array
    auto_index: int
    idle_power_w: Array

    @classmethod
    def from_tables(cls, tables: CostTables) -> ActionCosts:
        gap = tables.gap_s[:, None]
        pairs = tables.time_s.shape[1]
        return cls(
            time_s=np.concatenate([tables.time_s, tables.auto_time_s], axis=1) + gap,
            energy_j=np.concatenate([tables.energy_j + gap * tables.gap_power_w[None, :],
                                     tables.auto_energy_j + gap * tables.auto_gap_power_w], axis=1),
            core_mhz=np.concatenate([tables.pairs_mhz[:, 0], np.full(len(tables.memory_mhz), np.nan)]),
            mem_mhz=np.concatenate([tables.pairs_mhz[:, 1], tables.memory_mhz]),
            auto_index=pairs,
            idle_power_w=np.concatenate([tables.gap_power_w, tables.auto_gap_power_w.mean(axis=0)]),
        )

    @property
    def kernels(self) -> int:
        return int(self.time_s.shape[0])

    def label(self, action: int) -> str:
        """``"1410:3201"`` for a locked pair, ``"auto:3201"`` for auto at a memory clock."""
        core = self.core_mhz[action]
        return f"{'auto' if np.isnan(core) else f'{core:g}'}:{self.mem_mhz[action]:g}"

    def index_of(self, label: str) -> int:
        """Inverse of :meth:`label`; raises ``ValueError`` for an action the GPU does not support."""
        try:
            return self._action_of_label[label]
        except KeyError:
            raise ValueError(f"clock action {label!r} is not supported by this GPU profile") from None

    @functools.cached_property
    def _action_of_label(self) -> dict[str, int]:
        """Each :meth:`label`'s action (the first, were two alike), built on the first :meth:`index_of`."""
        actions: dict[str, int] = {}
        for action in range(len(self.mem_mhz)):
            actions.setdefault(self.label(action), action)
        return actions


@dataclass(frozen=True)
class Schedule:
    """An action per kernel (K,), with who made it and how long it took to make (s).

    ``reactive`` schedules come from a controller that reacted online: their actions are the clocks that
    were in effect (latency already applied), not requests to be issued ahead.
    """

    actions: Array
    method: str
    solve_s: float = 0.0
    info: dict[str, float] = field(default_factory=dict)
    reactive: bool = False


def switch_points(actions: Array) -> Array:
    """Kernel indices where the action differs from the previous kernel's."""
    return np.flatnonzero(actions[1:] != actions[:-1]) + 1


@dataclass(frozen=True)
class Outcome:
    """What a schedule costs when executed. ``applied`` (K,) is the action each kernel actually ran at."""

    time_s: float
    energy_j: float
    switches: int
    applied: Array


def replay(costs: ActionCosts, applied: Array, stall_s: float) -> Outcome:
    """Cost of a step whose kernels ran at ``applied`` actions (no latency effects beyond the stalls)."""
    rows = np.arange(costs.kernels)
    changes = switch_points(applied)
    stall_j = float(stall_s * costs.idle_power_w[applied[changes]].sum())
    return Outcome(float(costs.time_s[rows, applied].sum() + stall_s * len(changes)),
                   float(costs.energy_j[rows, applied].sum() + stall_j), len(changes), applied)


def request_times(costs: ActionCosts, actions: Array, latency_s: float) -> tuple[Array, Array]:
    """The changes a predictive controller makes: (kernel index, time the change takes effect in s from step
    start) for each change, aimed at the kernel's planned start, one latency apart at least."""
    rows = np.arange(costs.kernels)
    durations = costs.time_s[rows, actions]
    planned_start = np.cumsum(durations) - durations
    changes = switch_points(actions)
    effective = np.empty(len(changes))
    free_at = -np.inf
    for i, kernel in enumerate(changes):
        effective[i] = max(planned_start[kernel] - latency_s, free_at) + latency_s
        free_at = effective[i]
    return changes, effective


def execute(costs: ActionCosts, actions: Array, latency_s: float, stall_s: float) -> Outcome:
    """Execute a schedule with switching latency (see the module docstring). ``actions``: (K,) ints."""
    actions = np.asarray(actions, dtype=np.int64)
    changes, effective = request_times(costs, actions, latency_s)
    if latency_s <= 0 or len(changes) == 0:
        return replay(costs, actions.copy(), stall_s)
    applied = np.empty_like(actions)
    in_effect, pending, now = actions[0], 0, 0.0
    for kernel in range(costs.kernels):
        while pending < len(changes) and effective[pending] <= now + 1e-12:
            in_effect = actions[changes[pending]]
            pending += 1
        applied[kernel] = in_effect
        now += costs.time_s[kernel, in_effect]
    return replay(costs, applied, stall_s)
