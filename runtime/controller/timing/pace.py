"""The step's pace: how long each stretch between its anchors takes live, learned from the last steps.

:class:`Pace` keeps, for the last ``PACE_STEPS`` steps it learns from with the same number of anchors, each
segment's live duration (s): the step's start to its first anchor, anchor to anchor, the last anchor to the
step's end; their medians are the pace. :func:`host_offsets_s` puts a time on the step's timeline at its host
time from the step's start (s): each segment lasts its live median, stretched by its time at other clocks over
its time at the clocks it was measured at, and a time inside it is placed in proportion.

Invariants: steps with another number of anchors start the learning again; steps whose anchors are out of
order or outside the step are ignored. Which steps it learns from is the caller's
(:class:`~kdvfs.runtime.controller.timing.anchors.Anchors`); why a pace and which steps: docs/design/controller.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from kdvfs.common.arrays import Array
from kdvfs.common.compiled import compiled

PACE_STEPS = 5


def medians(history: ArrayLike) -> Array:
    """The median of each position over ``history``'s rows ((n, m), n >= 1: an array, or n (m,) arrays), the values
    ``np.median(np.stack(history), axis=0)`` gives: the middle of each sorted column (odd count) or the mean of its
    two middle values (even count); NaN where the column has a NaN. One compiled call (:func:`column_medians`):
    numpy's median, or its sort, takes a long Python path for a few values, on the controller's thread each
    step."""
    return column_medians(np.asarray(history, dtype=float))


@compiled
def column_medians(rows: Array) -> Array:
    """:func:`medians` of the (n, m) float64 ``rows`` (n >= 1): each column sorted (insertion sort, NaN last, as
    numpy sorts), its middle value or the mean of its two middle values, NaN where it has a NaN."""
    n, m = rows.shape
    middle, column = np.empty(m), np.empty(n)
    for j in range(m):
        for i in range(n):
            value, k = rows[i, j], i
            while k > 0 and (column[k - 1] > value or (np.isnan(column[k - 1]) and not np.isnan(value))):
                column[k] = column[k - 1]
                k -= 1
            column[k] = value
        if np.isnan(column[n - 1]):
            middle[j] = np.nan
        elif n % 2:
            middle[j] = column[n // 2]
        else:
            middle[j] = (column[n // 2 - 1] + column[n // 2]) / 2.0
    return middle


class RecentRows:
    """The last ``size`` rows of one length, oldest first, held in one (``count``, m) array: each step's
    :func:`medians` sorts it without stacking the rows anew. A row of another length starts again (it is the only
    one then)."""

    def __init__(self, size: int) -> None:
        self.size, self.count = size, 0
        self._rows = np.zeros((size, 0))
        column_medians(np.zeros((1, 1)))  # compiled (or loaded from numba's cache) here, not in a step

    @property
    def full(self) -> bool:
        """Whether ``size`` rows are held."""
        return self.count == self.size

    @property
    def width(self) -> int | None:
        """The rows' length (None: no rows)."""
        return self._rows.shape[1] if self.count else None

    def clear(self) -> None:
        self.count = 0

    def append(self, row: Array) -> None:
        """Add ``row`` (the oldest goes once ``size`` are held)."""
        if len(row) != self._rows.shape[1]:
            self._rows, self.count = np.zeros((self.size, len(row))), 0
        if self.count == self.size:
            self._rows[:-1] = self._rows[1:]
            self._rows[-1] = row
        else:
            self._rows[self.count] = row
            self.count += 1

    def medians(self) -> Array:
        """:func:`medians` of the rows held (at least one)."""
        return medians(self._rows[:self.count])


class Pace:
    """Median live segment durations of the last steps (docs/design/controller.md).

    Attributes:
        segments_s: (A+1,) the median live durations (s) of the step's segments between its start, its A
            anchors and its end, over the last ``steps`` steps with A anchors; None until there were that many.
    """

    def __init__(self, steps: int = PACE_STEPS) -> None:
        self.segments_s: Array | None = None
        self._history = RecentRows(steps)

    def observe(self, start_s: float, end_s: float, anchors_s: Sequence[float]) -> None:
        """Learn from one finished step (host times, s)."""
        times_s = np.array((start_s, *anchors_s, end_s), dtype=float)
        segments_s = times_s[1:] - times_s[:-1]  # np.diff's
        if len(segments_s) < 2 or bool((segments_s < 0).any()):
            return
        if self._history.width not in (None, len(segments_s)):
            self._history.clear()
            self.segments_s = None
        self._history.append(segments_s)
        if self._history.full:
            self.segments_s = self._history.medians()

    def for_anchors(self, anchors: int) -> Array | None:
        """The learned segments (:attr:`segments_s`) if learned for steps with ``anchors`` (> 0) anchors, else None."""
        fits = anchors > 0 and self.segments_s is not None and len(self.segments_s) == anchors + 1
        return self.segments_s if fits else None


class Knots(NamedTuple):
    """A timeline's segment edges for :func:`host_offsets_s`, with what of them does not change from step to step.

    Attributes:
        knots_s: (A+2,) the edges: 0, where the A anchors' kernels start, the step's end (s).
        lengths_s: (A+1,) the segments' lengths on this timeline (s), or None (the segments are the live ones).
        reference_s: (A+1,) their lengths on the timeline the live segments were measured at (s, at least 1e-12).
    """

    knots_s: Array
    lengths_s: Array | None = None
    reference_s: Array | None = None

    @classmethod
    def of(cls, knots_s: ArrayLike, reference_s: ArrayLike | None = None) -> Knots:
        """The knots ``knots_s``, stretched against ``reference_s`` (the same edges on the timeline the live
        segments were measured at; None: that timeline)."""
        knots_s = np.asarray(knots_s, dtype=float)
        if reference_s is None:
            return cls(knots_s)
        return cls(knots_s, np.diff(knots_s), np.maximum(np.diff(reference_s), 1e-12))


def host_offsets_s(segments_s: Array, knots_s: ArrayLike | Knots, times_s: ArrayLike,
                   reference_s: Array | None = None) -> Array:
    """Host time from the step's start (s) at each of ``times_s`` (s on a timeline from the step's start).

    Args:
        segments_s: (A+1,) live segment durations (:attr:`Pace.segments_s`).
        knots_s: (A+2,) the timeline's segment edges: 0, where the A anchors' kernels start, the step's end; or
            :class:`Knots` (then ``reference_s`` is theirs).
        times_s: times on that timeline (s; a number or an array), at most its end (beyond it: the end's host
            time).
        reference_s: (A+2,) the same edges on the timeline the segments were measured at, if another: each
            segment then lasts its live duration times its time on ``knots_s``'s timeline over the reference's.
    """
    knots = knots_s if isinstance(knots_s, Knots) else Knots.of(knots_s, reference_s)
    lengths_s = np.asarray(segments_s, dtype=float)
    if knots.lengths_s is not None and knots.reference_s is not None:
        lengths_s = lengths_s * knots.lengths_s / knots.reference_s
    host_knots_s = np.concatenate([[0.0], np.cumsum(lengths_s)])
    return np.interp(np.asarray(times_s, dtype=float), knots.knots_s, host_knots_s)
