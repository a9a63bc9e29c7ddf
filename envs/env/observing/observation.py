"""The observation of ``KernelDVFS-v0``: its layout (:class:`ObservationSpec`, named :data:`BLOCKS`) and windows.

The layout depends on the clock grid, the number of next kernels shown and the window lengths; its hash
(:meth:`ObservationSpec.hash`) is stored with every frozen policy, so a policy is never fed observations of
another layout. Bump ``OBSERVATION_VERSION`` whenever the meaning of any entry changes.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.envs.env.steps.clock_grid import ClockGrid
from kdvfs.envs.env.steps.step_data import KERNEL_FEATURES, StepData

OBSERVATION_VERSION = 5
WINDOW_METRICS = ("slowdown_pct", "saving_pct")
BUDGET_FEATURES = ("budget_pct", "budget_used", "affordable_slowdown_pct", "progress", "remaining_latencies")
CONTROLLER_FEATURES = ("pending_latencies", "controller_free", "immediate")
CONDITION_FEATURES = ("latency_ms", "auto_drift_pct", "run_slowdown_pct", "last_latency_ratio", "prediction_error_pct")
ADVISOR_FEATURES = ("saving_pct", "slowdown_pct", "rest_saving_pct", "rest_slowdown_pct", "in_effect")
PLAN_ADVISOR_FEATURES = ("rest_saving_pct", "rest_slowdown_pct", "in_effect", "exists")
OBS_LIMIT = 1000.0
"""Every entry is clipped to [-OBS_LIMIT, OBS_LIMIT] (percentages of very slow clocks can be large)."""
REMAINING_LATENCIES_CAP = 50.0
DIMENSIONS = {"n": "``next_kernels``, the coming kernels shown",
              "W+1": "the look-ahead windows: one per ``window_latencies``, then the rest of the step",
              "G": "C x M, the pairs of the clock grid (C core levels, auto first, by M memory clocks)",
              "C+M": "a core level's one-hot (C) then a memory clock's (M)",
              "P": "the plan advisors, one per ``plan_budgets``"}
"""The symbols block sizes are given in (:meth:`ObservationSpec.dimensions` gives their values)."""


@dataclass(frozen=True)
class Block:
    """One named block of the observation vector.

    Attributes:
        name: what the code reads and writes it by (part of the spec hash).
        dims: its shape, row-major (the last dimension varies fastest): numbers or symbols of ``DIMENSIONS``.
        description: what its entries are.
        units: their units.
    """

    name: str
    dims: tuple[int | str, ...]
    description: str
    units: str

    def size_text(self) -> str:
        """The shape as text, ``2 x (W+1) x G``."""
        parts = [f"({d})" if isinstance(d, str) and "+" in d and len(self.dims) > 1 else str(d) for d in self.dims]
        return " x ".join(parts)


BLOCKS = (
    Block("next_kernels", ("n", len(KERNEL_FEATURES)),
          "the next kernels: log10 duration (centred on 30 us), SM, DRAM and tensor utilisation, category one-hot "
          f"({len(KERNEL_FEATURES) - 4})", "log10 s, fractions, 0/1"),
    Block("window_slowdown_then_saving_pct", (len(WINDOW_METRICS), "W+1", "G"),
          "every pair's slowdown, then its energy saving, against auto over each window: 1x, 2x, 4x the latency "
          "(``window_latencies``) from where a request made now would take effect (kernel 0 at the first "
          "decision), then the rest of the step from there", "%"),
    Block("window_beyond_step", (1,),
          "1 when a request made now would take effect after the step's last kernel started (windows all 0)", "0/1"),
    Block("clocks_in_effect", ("C+M",), "one-hot core level and memory clock in effect", "0/1"),
    Block("clocks_pending", ("C+M",), "one-hot core level and memory clock pending (zeros if none)", "0/1"),
    Block("controller", (len(CONTROLLER_FEATURES),),
          "expected time until the pending change takes effect, controller free, the choice applies at once "
          "(first decision, or ideal switching)", "latencies, 0/1, 0/1"),
    Block("budget", (len(BUDGET_FEATURES),),
          "budget; share of it used so far ((elapsed - the prediction's auto time for the same kernels x (1 + "
          "the prediction error), as a controller measures them: :class:`~kdvfs.envs.env.observing.live.LiveState`) / "
          "(budget x auto step time)); slowdown still affordable over the rest of the step; progress (auto "
          "time so far / auto step "
          f"time); remaining step in latencies (capped at {REMAINING_LATENCIES_CAP:g}, / {REMAINING_LATENCIES_CAP:g})",
          "%, fraction, %, fraction, fraction"),
    Block("conditions", (len(CONDITION_FEATURES),),
          "what the controller measures of the disturbances: the episode's mean switching latency; how much "
          "slower auto's core runs now than in the captured step (the power limiter's thermal drift, as the A "
          "windows of the A/B measurement see it); the run's slowdown so far against the prediction's auto "
          "time for the same kernels; the last change's latency / the mean (1 if none); the "
          "step's prediction error so far: elapsed over the prediction's time for the same kernels at the clocks "
          "they ran at, minus 1 (0 before any kernel ran)",
          "ms, %, %, ratio, %"),
    Block("advisors", (len(ADVISOR_FEATURES), "W+1"),
          "per window advisor (the pair saving the most over its window among those whose slowdown there fits "
          "the affordable slowdown): its saving and slowdown over its window and over the rest of the step, and "
          "whether it is the pair in effect (feature-major)", "%, 0/1"),
    Block("plans_rest_saving_then_slowdown_pct", (2, "P"),
          "each plan's energy saving, then slowdown, against auto from where a request made now takes effect to "
          "the step's end", "%"),
    Block("plans_in_effect", ("P",), "whether each plan's proposed pair is the pair in effect", "0/1"),
    Block("fitting_plan", (len(PLAN_ADVISOR_FEATURES),),
          "the fitting plan (saving the most among the plans whose slowdown fits what is still affordable): its "
          "saving and slowdown from there, whether its pair is in effect, whether any plan fits", "%, %, 0/1, 0/1"),
    Block("budget_plan", (len(PLAN_ADVISOR_FEATURES),),
          "the same for the budget's plan (the largest plan budget within the episode's), and whether any plan "
          "is within the budget", "%, %, 0/1, 0/1"),
)
"""The observation's blocks, in order."""
ADVISOR_GROUPS = ("windows", "plans", "fitting_plan", "budget_plan")
"""The advisors, in order: one per window, one per plan, the fitting plan, the budget's plan (the action follows
one of the last three groups)."""


@dataclass(frozen=True)
class ObservationSpec:
    """Layout of one observation vector (float32): the :data:`BLOCKS` in order, sized for a grid and settings.

    Attributes:
        grid: the clock actions (C core levels by M memory clocks, G = C * M).
        next_kernels: how many coming kernels' features are shown.
        window_latencies: lengths of the look-ahead windows in switching latencies (e.g. 1, 2, 4); each
            starts where a request issued now would take effect. One more window runs from there to the
            step's end (the controller knows the whole step: training steps repeat).
        plan_budgets: budgets (fractions) of the plan advisors (:mod:`kdvfs.envs.env.advice.plan_advice`); empty:
            no plan advisors.
    """

    grid: ClockGrid
    next_kernels: int
    window_latencies: tuple[float, ...]
    plan_budgets: tuple[float, ...] = ()

    def dimensions(self) -> dict[str, int]:
        """The value of each symbol of ``DIMENSIONS``."""
        return {"n": self.next_kernels, "W+1": len(self.window_latencies) + 1, "G": self.grid.size,
                "C+M": self.grid.levels + len(self.grid.memory_mhz), "P": len(self.plan_budgets)}

    @cached_property
    def _layout(self) -> dict[str, tuple[int, tuple[int, ...]]]:
        """(start, shape) of each block."""
        values, start, layout = self.dimensions(), 0, {}
        for block in BLOCKS:
            shape = tuple(values[d] if isinstance(d, str) else d for d in block.dims)
            layout[block.name] = (start, shape)
            start += math.prod(shape)
        return layout

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of block ``name``."""
        return self._layout[name][1]

    def span(self, name: str) -> slice:
        """Where block ``name`` lies in the observation vector."""
        start, shape = self._layout[name]
        return slice(start, start + math.prod(shape))

    def view(self, observations: Array, name: str) -> Array:
        """Block ``name`` of ``observations`` (..., N) in its shape (a view where the slice allows one)."""
        return observations[..., self.span(name)].reshape(*observations.shape[:-1], *self.shape(name))

    def blocks(self) -> tuple[tuple[str, int], ...]:
        """(name, size) of each block in order."""
        return tuple((name, math.prod(shape)) for name, (_, shape) in self._layout.items())

    @property
    def size(self) -> int:
        return sum(size for _, size in self.blocks())

    def offsets(self) -> dict[str, int]:
        """Start index of each block."""
        return {name: start for name, (start, _) in self._layout.items()}

    def advisor_slots(self) -> dict[str, slice]:
        """Where each of ``ADVISOR_GROUPS`` lies among the advisors (their proposals, in this order)."""
        sizes = (len(self.window_latencies) + 1, len(self.plan_budgets), 1, 1)
        ends = np.cumsum(sizes).tolist()
        return {group: slice(end - size, end) for group, size, end in zip(ADVISOR_GROUPS, sizes, ends, strict=True)}

    @property
    def plan_choices(self) -> int:
        """Choices of the action's plan part: each plan, the fitting plan and the budget's plan."""
        return self.advisor_slots()["budget_plan"].stop - self.advisor_slots()["plans"].start

    @property
    def advisors(self) -> int:
        """Advisors: one per window, the rest of the step, each plan, the fitting plan and the budget's plan."""
        return self.advisor_slots()["budget_plan"].stop

    @property
    def static_size(self) -> int:
        """Entries that depend only on the decision point (next kernels, windows), not on the agent's past."""
        return self.span("window_beyond_step").stop

    def describe(self) -> dict[str, Any]:
        """Plain data that identifies the layout and meaning of every entry."""
        return {"version": OBSERVATION_VERSION, "blocks": [list(b) for b in self.blocks()],
                "kernel_features": list(KERNEL_FEATURES), "budget_features": list(BUDGET_FEATURES),
                "controller_features": list(CONTROLLER_FEATURES),
                "condition_features": list(CONDITION_FEATURES), "advisor_features": list(ADVISOR_FEATURES),
                "plan_advisor_features": list(PLAN_ADVISOR_FEATURES), "plan_budgets": list(self.plan_budgets),
                "window_latencies": list(self.window_latencies),
                "grid": self.grid.describe()}

    def hash(self) -> str:
        """sha256 (hex, first 16 characters) of :meth:`describe`."""
        text = json.dumps(self.describe(), sort_keys=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def observation_table(spec: ObservationSpec | None = None) -> str:
    """The blocks as a Markdown table (block, size, description [units]): sizes in the symbols of
    ``DIMENSIONS`` (listed below the table), or the numbers of ``spec``."""
    rows = ["| block | size | description |", "| --- | --- | --- |"]
    for block in BLOCKS:
        size = block.size_text() if spec is None else " x ".join(map(str, spec.shape(block.name)))
        rows.append(f"| `{block.name}` | {size} | {block.description} [{block.units}] |")
    if spec is None:
        rows += ["", "; ".join(f"{symbol}: {meaning}" for symbol, meaning in DIMENSIONS.items()) + "."]
    return "\n".join(rows)


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
    # Where a request made before kernel k lands: the first kernel starting one latency later (k = 0: at once).
    effect = np.searchsorted(starts, auto_start_s + latency_s, side="left")
    effect[0] = 0
    # Each window ends at the first kernel starting its length after the landing kernel's start (>= 1 kernel).
    columns = [effect]
    for multiple in window_latencies:
        end = np.searchsorted(starts, auto_start_s[effect.clip(max=kernels)] + latency_s * multiple, side="left")
        columns.append(np.maximum(end, effect + 1))
    # The last window is the rest of the step.
    columns.append(np.full(kernels + 1, kernels))
    return np.minimum(np.stack(columns, axis=1), kernels).astype(np.int64)


def static_observations(step: StepData, spec: ObservationSpec, latency_s: float) -> Array:
    """(K + 1, ``spec.static_size``) float32: the next-kernel and window blocks at every decision point.

    Window entries: every grid action's slowdown (%) against auto over each window (windows in order), then
    its energy saving (%) over each window; all zero, with the beyond-step flag set, where a request would
    take effect after the step's last kernel started.
    """
    kernels, width = step.kernels, step.features.shape[1]
    # next_kernels: the features of kernels k .. k + n - 1 (zeros past the step's end), kernel-major.
    padded = np.vstack([step.features, np.zeros((spec.next_kernels, width), dtype=np.float32)])
    coming = np.lib.stride_tricks.sliding_window_view(padded, spec.next_kernels, axis=0)[: kernels + 1]
    coming = coming.transpose(0, 2, 1).reshape(kernels + 1, spec.next_kernels * width)
    # Each window's time and energy at every grid action: differences of two cumulative rows,
    # (K + 1, W + 1, 2, G) as (decision point, window, time/energy, action).
    bounds = window_bounds(step.cumulative[:, 0, 0], latency_s, spec.window_latencies)
    beyond = bounds[:, 0] >= kernels
    rows = step.cumulative[bounds]
    window = rows[:, 1:] - rows[:, :1]
    # Relative to auto (action 0) over the same window: slowdown (time) and saving (energy, sign flipped), in
    # %; zero where the window lies beyond the step or auto's window is empty (kernels of an expected step
    # that did not run, StepData.executed_as).
    empty = beyond[:, None, None, None] | (window[..., :1] <= 0.0)
    auto = np.where(empty, 1.0, window[..., :1])
    relative = np.where(empty, 0.0, 100.0 * (window / auto - 1.0) * np.array([1.0, -1.0])[:, None])
    # Into the block's shape (WINDOW_METRICS, W + 1, G), flattened, clipped to the observation's limits.
    windows = np.clip(relative.transpose(0, 2, 1, 3).reshape(kernels + 1, -1), -OBS_LIMIT, OBS_LIMIT)
    return np.column_stack([coming, windows, beyond]).astype(np.float32)


def advisor_index(spec: ObservationSpec) -> Array:
    """(4, W + 1) flat offsets into the window block (shape (``WINDOW_METRICS``, W + 1, G)) of each window
    advisor's ``ADVISOR_FEATURES`` but the last: its saving and slowdown over its own window, then over the
    rest of the step (the last window). Add the advisor's pair to index its entries."""
    metrics, windows, pairs = spec.shape("window_slowdown_then_saving_pct")
    own, rest = np.arange(windows), np.full(windows, windows - 1)
    saving, slowdown = WINDOW_METRICS.index("saving_pct"), WINDOW_METRICS.index("slowdown_pct")
    rows = np.array([saving, slowdown, saving, slowdown])[:, None].repeat(windows, axis=1)
    return pairs * np.ravel_multi_index((rows, np.stack([own, own, rest, rest])), (metrics, windows))
