"""Learning when a GPU's energy counter updates from few reads: :func:`search_clock`.

A change is found back to back, the next one by reads ``MIN_PERIOD_READS - 1`` reads apart; then each period a
read in the middle of the window where the next update can come, against a read after the update before, halves
that window (the clocks, first update and period, that the reads allow form a convex polygon,
:class:`UpdateSearch`); once the window spans ``NARROW_READS`` reads it is read across back to back and the clock
is the polygon's centre. The algorithm: ``docs/design/device-safety.md``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from kdvfs.runtime.device.host_time import Clock
from kdvfs.runtime.device.update_clock import MARGIN_S, MIN_PERIOD_READS, NARROW_READS, Read, UpdateClock

CALIBRATION_S = 2.0
"""Longest the first two changes are looked for (s); none by then: no usable period."""
SEARCH_PERIODS = 12
"""Most periods the update clock is searched over past its first two changes; in the last, the window of the
update is read across back to back whatever its width."""
SEARCH_TRIES = 2
"""Searches for the update clock before the counter is taken to have no usable period."""

Point = tuple[float, float]
"""A candidate clock: (first update, period) (host s, s)."""


class Contradicted(Exception):
    """The reads of a search contradict a fixed period (within ``MARGIN_S``)."""


def search_clock(read: Callable[[], Read], clock: Clock, stop: threading.Event, read_s: Callable[[], float]
                 ) -> UpdateClock | None:
    """The counter's update clock, learned with ``read`` (reads it, timed on ``clock``; ``read_s``: a typical
    read, s); None: no usable period (no change within ``CALIBRATION_S``, changes within ``MIN_PERIOD_READS``
    reads, ``SEARCH_TRIES`` searches contradicted) or ``stop`` set."""
    for _ in range(SEARCH_TRIES):
        try:
            return _Search(read, clock, stop, read_s).run()
        except Contradicted:
            continue
    return None


class _Search:
    """One search (see the module docstring)."""

    def __init__(self, read: Callable[[], Read], clock: Clock, stop: threading.Event,
                 read_s: Callable[[], float]) -> None:
        self.read, self.clock, self.stop, self.read_s = read, clock, stop, read_s

    def run(self) -> UpdateClock | None:
        """The update clock (None: no usable period or stopped; raises :class:`Contradicted`)."""
        until_s = self.clock.now_s() + CALIBRATION_S
        first = self._change(self.read(), until_s)
        if first is None:
            return None
        search = UpdateSearch((first[0][0] - MARGIN_S, first[1][1] + MARGIN_S), (0.0, CALIBRATION_S))
        previous = current = first[1]
        while current[2] == previous[2]:
            previous = current
            if not self.clock.sleep_until(current[0] + (MIN_PERIOD_READS - 1) * self.read_s(), self.stop) \
                    or self.clock.now_s() >= until_s:
                return None
            current = self.read()
        if previous is first[1]:
            return None  # changes within MIN_PERIOD_READS reads
        search.cut(1, previous[0] - MARGIN_S, current[1] + MARGIN_S)
        return self._bisect(search)

    def _bisect(self, search: UpdateSearch) -> UpdateClock | None:
        """Each period, halve the window where the next update can come by a read in its middle against a read
        after the update before (when the window spans ``NARROW_READS`` reads, or in the last period, read across
        it back to back instead); the clock at the centre of the polygon the reads leave (see :meth:`run`)."""
        reference: Read | None = None
        """A read known to show the value of the update before the one probed."""
        for n in range(2, 2 + SEARCH_PERIODS):
            earliest_s, latest_s = search.window(n)
            if reference is None or reference[1] > earliest_s:
                reference = self._read_at(search.window(n - 1)[1] + MARGIN_S)
                if reference is None:
                    return None
                if reference[1] > earliest_s:
                    reference = None  # late: it may show either update's value
                    continue
            if latest_s - earliest_s <= NARROW_READS * self.read_s() or n == 1 + SEARCH_PERIODS:
                if not self.clock.sleep_until(earliest_s - 2 * self.read_s() - MARGIN_S, self.stop):
                    return None
                change = self._change(reference, latest_s + MARGIN_S)
                if change is not None:
                    search.cut(n, change[0][0] - MARGIN_S, change[1][1] + MARGIN_S)
                if change is None or search.empty:
                    raise Contradicted
                first_s, period_s = search.center()
                return UpdateClock([first_s, first_s + n * period_s], period_s)
            probe = self._read_at((earliest_s + latest_s - self.read_s()) / 2)
            if probe is None:
                return None
            changed = probe[2] != reference[2]
            search.cut(n, -math.inf if changed else probe[0] - MARGIN_S, probe[1] + MARGIN_S if changed else math.inf)
            if search.empty:
                raise Contradicted
            reference = probe if changed else None
        raise Contradicted  # the last period's reference read came too late

    def _read_at(self, time_s: float) -> Read | None:
        """A read at ``time_s`` (host s; at once if past); None: stopped first."""
        return self.read() if self.clock.sleep_until(time_s, self.stop) else None

    def _change(self, previous: Read, until_s: float) -> tuple[Read, Read] | None:
        """Read back to back from ``previous`` until the value changes: the last two reads; None: stopped, or a
        read that started at or after ``until_s`` (host s) saw no change."""
        while not self.stop.is_set():
            current = self.read()
            if current[2] != previous[2]:
                return previous, current
            if current[0] >= until_s:
                return None
            previous = current
        return None


class UpdateSearch:
    """The clocks (first update, period) that the findings so far allow: a convex polygon in that plane, cut
    by each finding that update n came at or after, or at or before, a time. Empty: the findings contradict a
    fixed period."""

    def __init__(self, first_s: tuple[float, float], period_s: tuple[float, float]) -> None:
        """Update 0 within ``first_s`` and the period within ``period_s`` (each (lowest, highest))."""
        (a, b), (c, d) = first_s, period_s
        self._corners: list[Point] = [(a, c), (b, c), (b, d), (a, d)]

    @property
    def empty(self) -> bool:
        return not self._corners

    def center(self) -> Point:
        """The mean of the polygon's corners (first update host s, period s); the polygon must not be empty."""
        firsts_s, periods_s = zip(*self._corners, strict=True)
        return sum(firsts_s) / len(firsts_s), sum(periods_s) / len(periods_s)

    def window(self, n: int) -> tuple[float, float]:
        """The earliest and latest update n can come (host s); the polygon must not be empty."""
        times_s = [first_s + n * period_s for first_s, period_s in self._corners]
        return min(times_s), max(times_s)

    def cut(self, n: int, earliest_s: float = -math.inf, latest_s: float = math.inf) -> None:
        """Update n came within ``[earliest_s, latest_s]`` (host s)."""
        if earliest_s > -math.inf:
            self._corners = _clip(self._corners, n, earliest_s, -1.0)
        if latest_s < math.inf:
            self._corners = _clip(self._corners, n, latest_s, 1.0)


def _clip(corners: list[Point], n: int, bound_s: float, sign: float) -> list[Point]:
    """The part of a convex polygon where ``sign (first + n period - bound_s) <= 0`` (Sutherland-Hodgman)."""
    kept: list[Point] = []
    for a, b in zip(corners, corners[1:] + corners[:1], strict=True):
        over_a, over_b = sign * (a[0] + n * a[1] - bound_s), sign * (b[0] + n * b[1] - bound_s)
        if over_a <= 0:
            kept.append(a)
        if over_a * over_b < 0:
            t = over_a / (over_a - over_b)
            kept.append((a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1])))
    return kept
