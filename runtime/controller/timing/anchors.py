"""The anchors: CUDA events recorded inside each training step (by
:mod:`kdvfs.runtime.controller.timing.anchor_hooks`), which the controller places its clock requests on.

Owns: which kernel each anchor stands for (:class:`TraceStructure`: the i-th hooked block's first kernel in its
phase, found by :func:`periodic_starts`; else the kernel whose expected start is nearest,
:func:`nearest_kernels`), the anchors' positions on the plan's timeline learned over ``LEARN_STEPS`` steps
(:class:`AnchorMap`), and the placing of a request on the latest anchor at least ``margin_s`` before its issue
instant (:class:`Anchors`), at the step's pace once learned. Times: seconds from the step's start, or host s.

Invariants: a step with another number of anchors drops the map; one with anchors out of order or outside
the step is ignored. A request falls back to the step-level instant when no anchor is early enough, the
anchor was not recorded in time, is earlier than one already used in the window, or lies further than
``tolerance`` of the step time from where the step-level timeline expects it. Details:
docs/design/controller.md.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.compiled import compiled
from kdvfs.envs.trace.trace import Phase, Trace
from kdvfs.runtime.controller.model.run_summary import AnchorFigures
from kdvfs.runtime.controller.model.step_plan import Request, StepPlan
from kdvfs.runtime.controller.timing.gpu_timeline import StepEnd, StepTimeline
from kdvfs.runtime.controller.timing.pace import Pace, RecentRows, host_offsets_s
from kdvfs.runtime.device.host_time import Clock

LEARN_STEPS = 5


def periodic_starts(names: Sequence[str], repetitions: int) -> list[int] | None:
    """Where each of ``repetitions`` back-to-back repetitions of one pattern starts in ``names``: for the shortest
    period whose longest periodic stretch (``names[i] == names[i + period]`` throughout) holds exactly that many
    whole repetitions and covers at least half of ``names``; None if no period does. The stretch may begin a
    few kernels before the true first repetition where the kernels before it end like the pattern does."""
    count = len(names)
    if repetitions < 1:
        return None
    for period in range(1, count // repetitions + 1):
        best_start, best_length, length = 0, 0, 0
        for i in range(count - period):
            length = length + 1 if names[i] == names[i + period] else 0
            if length > best_length:
                best_start, best_length = i - length + 1, length
        covered = best_length + period
        if covered // period == repetitions and 2 * covered >= count:
            return [best_start + r * period for r in range(repetitions)]
    return None


class TraceStructure:
    """The anchors' kernels from ``trace``'s structure (docs/design/controller.md).

    Args:
        trace: the captured step.
        every: the hooks' ``anchor_every`` (every N-th block carries them).
        blocks: the number of top-level blocks the hooks found (0 until the model's first forward).
    """

    def __init__(self, trace: Trace, every: int, blocks: Callable[[], int]) -> None:
        self._names = [kernel.name for kernel in trace.kernels]
        self._phases = [kernel.phase for kernel in trace.kernels]
        self.every, self._blocks = every, blocks
        self._found: dict[tuple[int, int], tuple[int, ...] | None] = {}
        """:meth:`kernels` by (blocks, anchors): the anchor map asks at every step it learns from, on the
        controller's thread, and the search is a long one on the controller's thread, holding the interpreter
        lock."""

    def _starts(self, phase: Phase, blocks: int) -> list[int] | None:
        """Each block's first kernel in ``phase`` (kernel indices, in the order the phase runs them)."""
        indices = [i for i, kernel_phase in enumerate(self._phases) if kernel_phase == phase]
        starts = periodic_starts([self._names[i] for i in indices], blocks)
        return None if starts is None else [indices[start] for start in starts]

    def kernels(self, anchors: int) -> tuple[int, ...] | None:
        """The kernel each of a step's ``anchors`` anchors stands for, or None where the structure does not give
        that many: the hooked blocks' forward anchors, then (with twice as many anchors) their backward ones,
        then (with one more) the optimizer's."""
        blocks = self._blocks()
        if (blocks, anchors) not in self._found:
            self._found[blocks, anchors] = self._kernels(blocks, anchors)
        return self._found[blocks, anchors]

    def _kernels(self, blocks: int, anchors: int) -> tuple[int, ...] | None:
        hooked = list(range(0, blocks, self.every))
        k = len(hooked)
        if not k or anchors not in (k, k + 1, 2 * k, 2 * k + 1) or (k == 1 and anchors == 2):  # 2: ambiguous
            return None
        forward = self._starts(Phase.FORWARD, blocks)
        if forward is None:
            return None
        found = [forward[b] for b in hooked]
        if anchors >= 2 * k:
            backward = self._starts(Phase.BACKWARD, blocks)  # block B - 1's backward runs first
            if backward is None:
                return None
            found += [backward[blocks - 1 - b] for b in reversed(hooked)]
        if anchors in (k + 1, 2 * k + 1):
            found += [i for i, phase in enumerate(self._phases) if phase == Phase.OPTIMIZER][:1]
        return tuple(found) if len(found) == anchors else None


@dataclass(frozen=True)
class Anchor:
    """Anchor ``index`` of a step: it stands for the start of ``kernel``, ``position_s`` from the step's start
    on the plan's timeline."""

    index: int
    kernel: int
    position_s: float


def nearest_kernels(kernel_start_s: Array, positions_s: Array) -> Array:
    """For each position (s from the step's start), the kernel whose expected start is nearest (the earlier one
    at a tie); ``kernel_start_s`` is sorted. One compiled call (:func:`nearest_starts`)."""
    return nearest_starts(np.asarray(kernel_start_s, dtype=float), np.asarray(positions_s, dtype=float))


@compiled
def nearest_starts(starts_s: Array, positions_s: Array) -> Array:
    """:func:`nearest_kernels` on float64 arrays: at each position, numpy's ``searchsorted`` (side "left", NaN
    last) clipped to 1..K-1 gives the start on the right, and the nearer of it and the one before is taken, as
    ``np.where(position - left <= right - position, left, right)`` takes it (the earlier at a tie)."""
    count = starts_s.shape[0]
    kernels = np.zeros(positions_s.shape[0], dtype=np.int64)
    if count < 2:
        return kernels
    for i in range(positions_s.shape[0]):
        position_s, low, high = positions_s[i], 0, count
        while low < high:
            middle = (low + high) >> 1
            start_s = starts_s[middle]
            if start_s < position_s or (np.isnan(position_s) and not np.isnan(start_s)):
                low = middle + 1
            else:
                high = middle
        right = min(max(low, 1), count - 1)
        left = right - 1
        kernels[i] = left if position_s - starts_s[left] <= starts_s[right] - position_s else right
    return kernels


class AnchorMap:
    """Where each anchor of a step sits on the plan's timeline (docs/design/controller.md)."""

    def __init__(self, kernel_start_s: Array, expected_s: float, learn_steps: int = LEARN_STEPS,
                 structure: Callable[[int], Sequence[int] | None] | None = None) -> None:
        self.kernel_start_s, self.expected_s = np.asarray(kernel_start_s, dtype=float), expected_s
        nearest_kernels(self.kernel_start_s, np.zeros(1))  # compiled (or loaded from numba's cache) here, not in a step
        self.structure = structure
        """The kernels a step's N anchors stand for, from the trace's structure (None: it does not fit)."""
        self.mapped_by = "time"
        """How the anchors' kernels were found: ``structure`` or ``time``."""
        self.anchors: tuple[Anchor, ...] = ()
        self.positions_s: list[float] = []
        """The anchors' positions (s from the step's start, plan timeline), in order."""
        self._history = RecentRows(learn_steps)
        self._kernels: Array = np.zeros(0, dtype=np.int64)
        """The anchors' kernels."""

    def observe(self, start_s: float, end_s: float, anchors_s: Sequence[float]) -> bool:
        """Learn from one finished step (host times, s); True when the map changed."""
        offsets_s = np.array(anchors_s, dtype=float) - start_s
        duration_s = end_s - start_s
        disordered = len(offsets_s) > 0 and bool((offsets_s[1:] - offsets_s[:-1] < 0).any() or offsets_s[0] < 0
                                                   or offsets_s[-1] > duration_s)
        if duration_s <= 0 or disordered:
            return False
        before = self.anchors
        if self._history.width not in (None, len(offsets_s)):
            self._history.clear()
            self._set_kernels(np.zeros(0, dtype=np.int64))
        self._history.append(offsets_s * self.expected_s / duration_s)
        if self._history.full and len(offsets_s):
            kernels = self._structural(len(offsets_s))  # the structure's needs no positions
            self.mapped_by = "time" if kernels is None else "structure"
            self._set_kernels(nearest_kernels(self.kernel_start_s, self._history.medians()) if kernels is None
                              else kernels)
        return self.anchors is not before and [a.kernel for a in before] != [a.kernel for a in self.anchors]

    def _set_kernels(self, kernels: Array) -> None:
        """The anchors at ``kernels`` (in order); kept as they are where those are their kernels already."""
        if kernels.shape != self._kernels.shape or not bool((kernels == self._kernels).all()):  # np.array_equal's
            self._kernels = kernels
            self.anchors = tuple(Anchor(i, int(k), float(self.kernel_start_s[k])) for i, k in enumerate(kernels))
            self.positions_s = [a.position_s for a in self.anchors]

    def _structural(self, anchors: int) -> Array | None:
        """The structure's kernels for ``anchors`` anchors, if it gives them in order and within the step."""
        found = None if self.structure is None else self.structure(anchors)
        if found is None or not all(0 <= k < len(self.kernel_start_s) for k in found):
            return None
        return np.asarray(found, dtype=np.int64) if bool(np.all(np.diff(found) > 0)) else None

    def pick(self, latest_s: float) -> Anchor | None:
        """The last anchor positioned at or before ``latest_s`` (s from the step's start), None if none."""
        index = bisect.bisect_right(self.positions_s, latest_s)
        return self.anchors[index - 1] if index else None


@dataclass(frozen=True)
class Placement:
    """When to issue a request and when its change is due (host s), and the anchor it was placed on, with
    the anchor's host time and when the thread woke from waiting for it (None: step-level timeline)."""

    request_s: float
    due_s: float
    anchor: Anchor | None = None
    anchor_s: float | None = None
    woke_s: float | None = None

    def record(self) -> dict[str, Any]:
        """The anchor fields of the request's log record."""
        if self.anchor is None:
            return {"anchor": None}
        return {"anchor": self.anchor.index, "anchor_kernel": self.anchor.kernel, "anchor_s": self.anchor_s,
                "woke_s": self.woke_s}


class Anchors:
    """Learns the anchor map and places each window's requests (docs/design/controller.md).

    Args:
        plan: the step's plan (its expected kernel starts and step time).
        timeline: where anchors are waited for.
        clock: the host clock.
        latency_s: switching latency: requests go out this long before the change is due.
        margin_s: an anchor must be placed at least this long before the request's issue instant.
        tolerance: largest distance of an anchor from its step-level instant, as a fraction of the step time.
        learn_auto: learn the map from steps in auto mode too (a dry run, whose plan timeline is the auto one).
        pace_from_auto: learn the pace from the steps in auto mode instead of the controlled ones (online
            decisions that set clocks: :mod:`kdvfs.runtime.controller.timing.pace`).
        structure: the anchors' kernels from the trace's structure (:class:`AnchorMap`).
    """

    def __init__(self, plan: StepPlan, timeline: StepTimeline, clock: Clock, latency_s: float, margin_s: float,
                 tolerance: float, learn_auto: bool, pace_from_auto: bool = False,
                 structure: Callable[[int], Sequence[int] | None] | None = None) -> None:
        self.plan, self.timeline, self.clock = plan, timeline, clock
        self.latency_s, self.margin_s, self.tolerance, self.learn_auto = latency_s, margin_s, tolerance, learn_auto
        self.pace_from_auto = pace_from_auto
        self.map = AnchorMap(plan.kernel_start_s, plan.expected_s, structure=structure)
        self.pace = Pace()
        self.counts: Counter[str] = Counter()
        self._step, self._start_s, self._scale, self._last_s = 0, 0.0, 1.0, -np.inf

    def learn(self, end: StepEnd, matched: bool, controlled: bool) -> bool:
        """Learn the pace (from a controlled step, or one at auto with ``pace_from_auto``) and the map (also from
        a step at auto in a dry run) from a finished step (controlled: the controller placed its changes); True
        when the map changed."""
        if not matched or end.duration_s is None:
            return False
        start_s = end.end_s - end.duration_s
        if (not controlled) if self.pace_from_auto else controlled:
            self.pace.observe(start_s, end.end_s, end.anchors_s)
        return (controlled or self.learn_auto) and self.map.observe(start_s, end.end_s, end.anchors_s)

    def begin(self, step: int, start_s: float, scale: float) -> None:
        """Start the window of step ``step``, which started at host time ``start_s`` (timeline x ``scale``)."""
        self._step, self._start_s, self._scale, self._last_s = step, start_s, scale, -np.inf

    def place(self, request: Request) -> Placement:
        """When to issue ``request`` (of the current window) and when it is due; may wait for an anchor."""
        due_s = self._start_s + self._host_s(request.due_s / self._scale)
        step_level = Placement(due_s - (request.due_s - request.offset_s), due_s)
        anchor = self.map.pick((request.offset_s - self.margin_s) / self._scale)
        if anchor is None:
            self.counts["step_level"] += 1
            return step_level
        anchor_s = self.timeline.anchor_s(self._step, anchor.index, step_level.request_s)
        woke_s = self.clock.now_s()
        expected_s = self._start_s + self._scale * anchor.position_s
        if anchor_s is None:
            self.counts["missing"] += 1
            return step_level
        if anchor_s < self._last_s or abs(anchor_s - expected_s) > self.tolerance * self._scale * self.plan.expected_s:
            self.counts["rejected"] += 1
            return step_level
        self.counts["anchored"] += 1
        self._last_s = anchor_s
        due_s = anchor_s + self._host_s(request.due_s / self._scale) - self._host_s(anchor.position_s)
        return Placement(due_s - self.latency_s, due_s, anchor, anchor_s, woke_s)

    def _host_s(self, time_s: float) -> float:
        """Host time from the window's start (s) at ``time_s`` on the plan's timeline (past its end: into the
        next step's), at the step's pace (docs/design/controller.md)."""
        segments_s = self.pace.for_anchors(len(self.map.anchors))
        if segments_s is None:
            return self._scale * time_s
        knots_s = np.concatenate([[0.0], self.map.positions_s, [self.plan.expected_s]])
        if time_s <= self.plan.expected_s:
            return float(host_offsets_s(segments_s, knots_s, time_s))
        step_s, later_s = host_offsets_s(segments_s, knots_s, [self.plan.expected_s, time_s - self.plan.expected_s])
        return float(step_s + later_s)

    def figures(self, blocks: int | None) -> AnchorFigures:
        """For the summary: requests placed on anchors, on the step-level timeline (no anchor early enough),
        and fallbacks (anchor missing or rejected); the learned anchors; ``blocks``: the blocks hooked."""
        return AnchorFigures(self.counts["anchored"], self.counts["step_level"], self.counts["missing"],
                             self.counts["rejected"], len(self.map.anchors), self.map.mapped_by, blocks)
