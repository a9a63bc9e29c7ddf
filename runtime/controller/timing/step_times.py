"""Where a step's kernels fall in host time (:class:`StepTimes`): the model's timeline of the expected step,
placed from the latest anchor the GPU passed and stretched to the run (see
docs/design/controller.md, "Online decisions", "progress").

A passed anchor (:data:`PassedAnchor`) is ``(index, host s, kernel)``: the anchor's index in the anchor map
(-1: none passed yet, the step's start stands for it), when the GPU passed it and the kernel it stands for."""

from __future__ import annotations

import array
import statistics
from collections import deque
from collections.abc import Sequence

import numpy as np

from kdvfs.agents.learned.policy.online import kernel_at
from kdvfs.runtime.controller.timing.anchors import Anchor, AnchorMap
from kdvfs.runtime.controller.timing.gpu_timeline import StepEnd
from kdvfs.runtime.controller.timing.pace import Knots, Pace, host_offsets_s

SCALE_STEPS = 5
"""Matched steps at auto whose median sets the auto scale."""

PassedAnchor = tuple[int, float, int]
"""(index in the anchor map or -1, host s, kernel): where the GPU was last seen (see the module docstring)."""


class StepTimes:
    """Host times of the expected step's kernels (see the module docstring).

    Args:
        cumulative_s: each kernel's start on each pair's model timeline ((K+1, pairs) s; the last row the step's
            end; pair 0 auto).
        auto_time_s: the step's auto time on the model timeline (s).
        anchor_map: which kernel each anchor stands for; pace: the step's pace between anchors.
    """

    def __init__(self, cumulative_s: np.ndarray, auto_time_s: float, anchor_map: AnchorMap, pace: Pace) -> None:
        self.cumulative_s, self.auto_time_s, self.anchor_map, self.pace = cumulative_s, auto_time_s, anchor_map, pace
        self.auto_scale = 1.0
        """Host seconds per model second of the auto step (median of the last matched auto steps; 1 before)."""
        self._scales: deque[float] = deque(maxlen=SCALE_STEPS)
        self._times_s: dict[int, Sequence[float]] = {}
        self._arrays_s: dict[int, np.ndarray] = {}
        self._basis: tuple[np.ndarray | None, tuple[Anchor, ...], float] = (pace.segments_s, anchor_map.anchors,
                                                                             self.auto_scale)
        """The pace's segments, the anchors and the auto scale the host times were found from."""
        self._columns_s: dict[int, np.ndarray] = {}
        """Each pair's column of ``cumulative_s``, contiguous (what ``np.interp`` reads)."""
        self._knots: dict[int, Knots] = {}
        self._knots_for: tuple[Anchor, ...] = ()
        """Each pair's knots (:class:`Knots`: at 0, the anchors' kernels, the step's end), for these anchors."""

    def observe(self, end: StepEnd, matched: bool, controlled: bool) -> None:
        """Learn the auto scale from a finished step (matched and at auto); the kernels' host times are found
        again where what they are found from changed: the pace or the anchor map (each learned from the same step
        just before; each a new object when it changed) or the auto scale."""
        if matched and not controlled and end.duration_s is not None:
            self._scales.append(end.duration_s / self.auto_time_s)
            self.auto_scale = statistics.median(self._scales)
        basis = (self.pace.segments_s, self.anchor_map.anchors, self.auto_scale)
        if not (basis[0] is self._basis[0] and basis[1] is self._basis[1] and basis[2] == self._basis[2]):
            self._basis = basis
            self._times_s.clear()
            self._arrays_s.clear()

    def at(self, pair: int) -> Sequence[float]:
        """Host time from the step's start (s) at each kernel's start on ``pair``'s model timeline ((K+1,), the
        last the step's end): at the step's pace once it is learned (measured on the auto timeline, or in a
        dry run at auto clocks: each segment stretched by its time at ``pair`` over auto's), else stretched by
        the auto scale. Python floats in an ``array.array`` (a list's values, without a float object made for
        each of thousands of kernels at every step)."""
        times_s = self._times_s.get(pair)
        if times_s is None:
            column_s = self._columns_s.get(pair)
            if column_s is None:
                column_s = self._columns_s[pair] = np.ascontiguousarray(self.cumulative_s[:, pair])
            segments_s = self.pace.for_anchors(len(self.anchor_map.anchors))
            if segments_s is None:
                host_s = self.auto_scale * column_s
            else:
                host_s = host_offsets_s(segments_s, self._pair_knots(pair, column_s), column_s)
            times_s = self._times_s[pair] = array.array("d", host_s.tobytes())
            self._arrays_s[pair] = host_s
        return times_s

    def _pair_knots(self, pair: int, column_s: np.ndarray) -> Knots:
        """``pair``'s knots at 0, each anchor's kernel and the step's end (``column_s``: its timeline), stretched
        against auto's; found again when the anchor map changed."""
        anchors = self.anchor_map.anchors
        if self._knots_for is not anchors:
            self._knots, self._knots_for = {}, anchors
        knots = self._knots.get(pair)
        if knots is None:
            kernels = [0] + [a.kernel for a in anchors] + [len(column_s) - 1]
            knots = self._knots[pair] = Knots.of(column_s[kernels], self.cumulative_s[kernels, 0])
        return knots

    def kernel_s(self, anchor: PassedAnchor, pair: int, kernel: int) -> float:
        """When ``kernel`` is expected to start (host s): after ``anchor``, at ``pair``'s clocks."""
        times_s = self.at(pair)
        return anchor[1] + times_s[kernel] - times_s[anchor[2]]

    def kernel_running(self, anchor: PassedAnchor, pair: int, at_s: float) -> int:
        """The kernel expected to run at host time ``at_s`` (s), after ``anchor``, at ``pair``'s clocks (never one
        before the anchor's, nor past the last)."""
        return kernel_at(self.at(pair), anchor[2], at_s - anchor[1])

    def array_at(self, pair: int) -> np.ndarray:
        """:meth:`at` as a (K+1,) float64 array (for compiled code)."""
        self.at(pair)
        return self._arrays_s[pair]

    def end_s(self, anchor: PassedAnchor, start_s: float, step_s: float) -> float:
        """The step's expected end (host s) for a step that started at ``start_s`` and is expected to last
        ``step_s``: from the last anchor passed (``step_s``'s share after its kernel, at auto's proportions on
        the step's pace once learned), else from the step's start."""
        if anchor[0] < 0:
            return start_s + step_s
        auto_s = self.at(0)
        return anchor[1] + step_s * (auto_s[-1] - auto_s[anchor[2]]) / auto_s[-1]
