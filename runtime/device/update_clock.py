"""When a GPU's energy counter updates: :class:`UpdateClock`, fitted to measured changes (pure: no reads, no
host clock; :mod:`kdvfs.runtime.device.energy_trace` reads the counter and feeds it), and the constants its
readers share."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

FIT_UPDATES = 64
"""Measured changes the clock is fitted over (the last)."""
DRIFT_S_PER_S = 5e-4
"""How far the counter's updates may drift from a fixed period, per second."""
NARROW_READS = 3.0
"""Two reads around a change measure it when they span at most this many typical reads."""
MIN_PERIOD_READS = 4
"""A counter that changes within this many reads has no usable period."""
MARGIN_S = 1e-3
"""A planned read starts this long after its update's uncertainty, and a bound on an update found by reads is
widened by it (s): the updates' own jitter about the clock."""

Read = tuple[float, float, float]
"""One read: its start and end (host s) and the value (J)."""


class UpdateClock:
    """When a counter updates: at ``tick_s + n period_s`` for whole n, fitted to measured changes."""

    def __init__(self, changes_s: list[float], period_s: float) -> None:
        """From the times of measured changes (s, increasing, whole periods of about ``period_s`` apart)."""
        self.period_s, self.tick_s = period_s, changes_s[-1]
        self.slack_s = 0.0
        """Added to the uncertainty after a change was not found where expected, until one is measured (s)."""
        self._measured: deque[float] = deque(maxlen=FIT_UPDATES)
        for change_s in changes_s:
            self.measured(change_s)

    def at_or_before(self, time_s: float) -> float:
        """The last expected update at or before ``time_s`` (host s)."""
        return self.tick_s + math.floor((time_s - self.tick_s) / self.period_s) * self.period_s

    def after(self, time_s: float) -> float:
        """The first expected update after ``time_s`` (host s)."""
        return self.at_or_before(time_s) + self.period_s

    def uncertainty_s(self, now_s: float, read_s: float) -> float:
        """How far an expected update may be off at ``now_s`` (s): a read (``read_s``: how closely a change is
        measured), per second since the last measured change the period's own (two reads, the error of the
        changes at either end, over the time the measured changes span) and ``DRIFT_S_PER_S``, and
        ``slack_s``."""
        span_s = max(self._measured[-1] - self._measured[0], self.period_s)
        return read_s + self.slack_s + (now_s - self._measured[-1]) * (2 * read_s / span_s + DRIFT_S_PER_S)

    @property
    def last_measured_s(self) -> float:
        return self._measured[-1]

    def measured(self, change_s: float) -> None:
        """A change measured at ``change_s`` (host s, within about a read): fit the clock again (one measured
        before counts once)."""
        if change_s in self._measured:
            return
        self._measured.append(change_s)
        self.slack_s = 0.0
        times_s = np.array(self._measured)
        counts = np.round((times_s - change_s) / self.period_s)
        self.tick_s = change_s
        if len(np.unique(counts)) >= 2:
            slope, intercept = np.polyfit(counts, times_s, 1)
            if 0.5 * self.period_s < slope < 2.0 * self.period_s:
                self.period_s, self.tick_s = float(slope), float(intercept)


def measured_s(before: Read, after: Read) -> float:
    """Where two reads close around a change measure it (host s): the mean of their starts and ends."""
    return sum(before[:2] + after[:2]) / 4
