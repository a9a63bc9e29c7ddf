"""The online decisions' log records, encoded with little work: dozens a controlled step, each on the
controller's thread holding the interpreter lock that a launch-bound training loop waits for.

:class:`DecisionRecords` writes each ``{"event": "decision", ...}`` line with one f-string whose parts are
known ahead (the clock labels and names JSON-encoded once) instead of building a dict and encoding it, which
takes the controller's thread several times longer. The line is exactly
``json.dumps`` of :meth:`DecisionRecords.record` (tested); a record with a non-finite float is encoded by
``json.dumps`` itself. :func:`quantiles` gives the median and p99 the summary reports of their times.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.compiled import compiled
from kdvfs.runtime.controller.model.run_summary import Quantiles


class DecisionRecords:
    """Log lines of online decisions whose clocks are grid pairs named by ``labels`` (``"1410:3201"``)."""

    def __init__(self, labels: tuple[str, ...]) -> None:
        self.labels = labels
        self._encoded = tuple(json.dumps(label) for label in labels)
        self._names: dict[str, str] = {}

    def record(self, step: int, kernel: int, source: str, in_effect: int, pending: int | None, budget_pct: float,
               budget_used: float, affordable_pct: float, action: tuple[int, ...], clocks: int | None,
               wall_us: float, next_wake: str) -> dict[str, Any]:
        """The record as a dict (pairs by label; None for no pair pending or no request)."""
        return {"event": "decision", "step": step, "kernel": kernel, "source": source,
                "in_effect": self.labels[in_effect], "pending": None if pending is None else self.labels[pending],
                "budget_pct": budget_pct, "budget_used": budget_used, "affordable_pct": affordable_pct,
                "action": list(action), "clocks": None if clocks is None else self.labels[clocks],
                "wall_us": wall_us, "next_wake": next_wake}

    def line(self, step: int, kernel: int, source: str, in_effect: int, pending: int | None, budget_pct: float,
             budget_used: float, affordable_pct: float, action: tuple[int, ...], clocks: int | None,
             wall_us: float, next_wake: str) -> str:
        """:meth:`record`'s JSON line (with its newline), as ``json.dumps`` writes it."""
        if not (math.isfinite(budget_pct) and math.isfinite(budget_used) and math.isfinite(affordable_pct)
                and math.isfinite(wall_us)):
            return json.dumps(self.record(step, kernel, source, in_effect, pending, budget_pct, budget_used,
                                          affordable_pct, action, clocks, wall_us, next_wake)) + "\n"
        pending_json = "null" if pending is None else self._encoded[pending]
        clocks_json = "null" if clocks is None else self._encoded[clocks]
        return (f'{{"event": "decision", "step": {step}, "kernel": {kernel}, "source": {self._name(source)}, '
                f'"in_effect": {self._encoded[in_effect]}, "pending": {pending_json}, '
                f'"budget_pct": {float(budget_pct)!r}, "budget_used": {float(budget_used)!r}, '
                f'"affordable_pct": {float(affordable_pct)!r}, "action": [{", ".join(map(str, action))}], '
                f'"clocks": {clocks_json}, "wall_us": {float(wall_us)!r}, "next_wake": {self._name(next_wake)}}}\n')

    def _name(self, name: str) -> str:
        encoded = self._names.get(name)
        if encoded is None:
            encoded = self._names[name] = json.dumps(name)
        return encoded


def quantiles(values: list[float]) -> Quantiles:
    """Median and p99 of ``values`` (None for none)."""
    if not values:
        return Quantiles(None, None)
    return Quantiles(float(np.median(values)), float(np.percentile(values, 99)))


class RecentDurations:
    """The last ``size`` durations (s): the latest and their percentiles."""

    def __init__(self, size: int) -> None:
        self._values_s = np.zeros(size)
        self._count = 0
        self.latest_s: float | None = None
        """The last duration added (None: none yet)."""
        linear_percentile(self._values_s[:1], 90.0)  # compiled (or loaded from numba's cache) here, not in a step

    def append(self, duration_s: float) -> None:
        self._values_s[self._count % len(self._values_s)] = duration_s
        self._count += 1
        self.latest_s = duration_s

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0 to 100) of the last ``size`` durations (s; 0 before any): the value of
        ``np.percentile`` (:func:`linear_percentile`)."""
        count = min(self._count, len(self._values_s))
        return float(linear_percentile(self._values_s[:count], float(q))) if count else 0.0


@compiled
def linear_percentile(values: Array, q: float) -> float:
    """The ``q``-th percentile (0 to 100) of ``values`` (at least one), the value of ``np.percentile`` (its
    default, linear method: the sorted values interpolated at ``(n - 1) q / 100``, in numpy's arithmetic; NaN if
    any is NaN) in one compiled call: numpy's general path is long for one percentile of a few hundred values,
    once a controlled step on the controller's thread."""
    count = values.shape[0]
    ordered = np.sort(values)  # NaN last
    if np.isnan(ordered[count - 1]):
        return np.nan
    position = (count - 1) * (q / 100)
    below = math.floor(position)
    gamma = position - below
    above = below + 1
    if position >= count - 1:
        below = above = count - 1
    low, high = ordered[below], ordered[above]
    return low + (high - low) * gamma if gamma < 0.5 else high - (high - low) * (1 - gamma)
