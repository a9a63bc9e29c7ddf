"""The observation of ``KernelDVFS-v0``: its layout (:class:`ObservationSpec`) and look-ahead windows.

The layout depends on the clock grid, the number of next kernels shown and the window lengths; its hash
(:meth:`ObservationSpec.hash`) is stored with every frozen policy, so a policy is never fed observations of
another layout. Bump ``OBSERVATION_VERSION`` whenever the meaning of any entry changes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from kdvfs.envs.env.clock_grid import ClockGrid
from kdvfs.envs.env.step_data import KERNEL_FEATURES, StepData
from kdvfs.envs.model.cost_model import Array

OBSERVATION_VERSION = 2
BUDGET_FEATURES = ("budget_pct", "budget_used", "affordable_slowdown_pct", "progress", "remaining_latencies")
CONTROLLER_FEATURES = ("pending_latencies", "controller_free", "immediate")
ADVISOR_FEATURES = ("saving_pct", "slowdown_pct", "rest_saving_pct", "rest_slowdown_pct", "in_effect")
PLAN_ADVISOR_FEATURES = ("rest_saving_pct", "rest_slowdown_pct", "in_effect", "exists")
OBS_LIMIT = 1000.0
"""Every entry is clipped to [-OBS_LIMIT, OBS_LIMIT] (percentages of very slow clocks can be large)."""
REMAINING_LATENCIES_CAP = 50.0


@dataclass(frozen=True)
class ObservationSpec:
    """Layout of one observation vector (float32), block by block.

    Attributes:
        grid: the clock actions (C core levels by M memory clocks, G = C * M).
        next_kernels: how many coming kernels' features are shown.
        window_latencies: lengths of the look-ahead windows in switching latencies (e.g. 1, 2, 4); each
            starts where a request issued now would take effect. One more window runs from there to the
            step's end (the controller knows the whole step: training steps repeat).
        plan_budgets: slowdown budgets (fractions) of the plan advisors (:mod:`kdvfs.envs.env.plan_advice`); empty:
            no plan advisors.
    """

    grid: ClockGrid
    next_kernels: int
    window_latencies: tuple[float, ...]
    plan_budgets: tuple[float, ...] = ()

    def blocks(self) -> tuple[tuple[str, int], ...]:
        """(name, size) of each block in order."""
        clocks = self.grid.levels + len(self.grid.memory_mhz)
        return (("next_kernels", self.next_kernels * len(KERNEL_FEATURES)),
                ("window_slowdown_then_saving_pct", (len(self.window_latencies) + 1) * 2 * self.grid.size),
                ("window_beyond_step", 1), ("clocks_in_effect", clocks), ("clocks_pending", clocks),
                ("controller", len(CONTROLLER_FEATURES)), ("budget", len(BUDGET_FEATURES)),
                ("advisors", (len(self.window_latencies) + 1) * len(ADVISOR_FEATURES)),
                ("plans_rest_saving_then_slowdown_pct", 2 * len(self.plan_budgets)),
                ("plans_in_effect", len(self.plan_budgets)), ("fitting_plan", len(PLAN_ADVISOR_FEATURES)),
                ("budget_plan", len(PLAN_ADVISOR_FEATURES)))

    @property
    def size(self) -> int:
        return sum(size for _, size in self.blocks())

    def offsets(self) -> dict[str, int]:
        """Start index of each block."""
        sizes = [size for _, size in self.blocks()]
        return {name: int(start) for (name, _), start in zip(self.blocks(), np.cumsum([0, *sizes[:-1]]), strict=True)}

    @property
    def advisors(self) -> int:
        """Advisor actions after the grid's pairs: one per window, the rest of the step, each plan, the
        fitting plan and the budget's plan."""
        return len(self.window_latencies) + 1 + len(self.plan_budgets) + 2

    @property
    def static_size(self) -> int:
        """Entries that depend only on the decision point (next kernels, windows), not on the agent's past."""
        return self.offsets()["clocks_in_effect"]

    def describe(self) -> dict[str, Any]:
        """Plain data that identifies the layout and meaning of every entry."""
        return {"version": OBSERVATION_VERSION, "blocks": [list(b) for b in self.blocks()],
                "kernel_features": list(KERNEL_FEATURES), "budget_features": list(BUDGET_FEATURES),
                "controller_features": list(CONTROLLER_FEATURES), "advisor_features": list(ADVISOR_FEATURES),
                "plan_advisor_features": list(PLAN_ADVISOR_FEATURES), "plan_budgets": list(self.plan_budgets),
                "window_latencies": list(self.window_latencies),
                "grid": self.grid.describe()}

    def hash(self) -> str:
        """sha256 (hex, first 16 characters) of :meth:`describe`."""
        text = json.dumps(self.describe(), sort_keys=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def window_bounds(auto_start_s: Array, latency_s: float, window_latencies: tuple[float, ...]) -> Array:
    """(K + 1, 2 + W) kernel indices per decision point k (before kernel k; k = K is the step's end).

    Column 0 is the first kernel starting at or after ``start[k] + latency`` on the auto timeline (where a
    request issued before kernel k takes effect), 0 for k = 0 (the step's first clocks are in effect from
    its start); column w is the end (exclusive) of window w, which lasts ``window_latencies[w] * latency``
    from there and holds at least one kernel; the last column is K (the rest of the step). Indices are
    clipped to K.

    Args:
        auto_start_s: (K + 1,) start of each kernel in auto mode (s), the step's end last.
        latency_s: the switching latency (s), >= 0.
        window_latencies: window lengths in latencies.
    """
    kernels = len(auto_start_s) - 1
    starts = auto_start_s[:-1]
    effect = np.searchsorted(starts, auto_start_s + latency_s, side="left")
    effect[0] = 0
    columns = [effect]
    for multiple in window_latencies:
        end = np.searchsorted(starts, auto_start_s[effect.clip(max=kernels)] + latency_s * multiple, side="left")
        columns.append(np.maximum(end, effect + 1))
    columns.append(np.full(kernels + 1, kernels))
    return np.minimum(np.stack(columns, axis=1), kernels).astype(np.int64)


def static_observations(step: StepData, spec: ObservationSpec, latency_s: float) -> Array:
    """(K + 1, ``spec.static_size``) float32: the next-kernel and window blocks at every decision point.

    Window entries: every grid action's slowdown (%) against auto over each window (windows in order), then
    its energy saving (%) over each window; all zero, with the beyond-step flag set, where a request would
    take effect after the step's last kernel started.
    """
    kernels, width = step.kernels, step.features.shape[1]
    padded = np.vstack([step.features, np.zeros((spec.next_kernels, width), dtype=np.float32)])
    coming = np.lib.stride_tricks.sliding_window_view(padded, spec.next_kernels, axis=0)[: kernels + 1]
    coming = coming.transpose(0, 2, 1).reshape(kernels + 1, spec.next_kernels * width)
    bounds = window_bounds(step.cumulative[:, 0, 0], latency_s, spec.window_latencies)
    beyond = bounds[:, 0] >= kernels
    rows = step.cumulative[bounds]
    window = rows[:, 1:] - rows[:, :1]
    auto = np.where(beyond[:, None, None, None], 1.0, window[..., :1])
    relative = 100.0 * (window / auto - 1.0) * np.array([1.0, -1.0])[:, None]
    relative[beyond] = 0.0
    windows = np.clip(relative.transpose(0, 2, 1, 3).reshape(kernels + 1, -1), -OBS_LIMIT, OBS_LIMIT)
    return np.column_stack([coming, windows, beyond]).astype(np.float32)


def advisor_index(windows: int, size: int) -> Array:
    """(4, windows) offsets into the window block (slowdowns of every window, then savings) of each
    advisor's saving and slowdown over its own window and over the rest of the step (add its pair)."""
    own = np.arange(windows) * size
    rest = np.full(windows, (windows - 1) * size)
    savings = windows * size
    return np.stack([own + savings, own, rest + savings, rest])
