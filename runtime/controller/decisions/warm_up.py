"""A throwaway decision right before each decision point on the controller's thread (``OnlineConfig.warm_up``).

Between decision points the controller's thread sleeps, and a core that slept runs the next decision on cold
code: numba's dispatch of the call, its compiled code and the interpreter's path to it (its arrays stay warm).
So the thread wakes :meth:`WarmUp.lead_s` before the point and rehearses its decision: the live state at that
moment (the same code as the point's, from the last anchor the loop saw) and a throwaway decision at it
(:meth:`~kdvfs.agents.learned.policy.online.OnlinePolicy.warm`, the same calls as a decision; its result is dropped
and no later decision changes); then it goes on to the decision without sleeping in between, on a warm core
(``docs/results.md``). The lead is the shortest of the last ``WARM_UPS`` warm-ups, so the decision point is
early (and the thread sleeps the rest, cooling the core again) only after a warm-up shorter than all of those,
and late by the warm-up's spread above it. A decision's wall time (``decision_us``) then runs from after its
warm-up; the warm-ups' own time is ``warm_us`` (and ``warm_ms``, in all), and their CPU is in the thread's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from kdvfs.runtime.controller.decisions.decision_records import quantiles
from kdvfs.runtime.controller.model.run_summary import Quantiles

WARM_UPS = 64
"""Warm-ups whose durations set the lead."""


class WarmUp:
    """Runs and times the throwaway decisions (see the module docstring)."""

    def __init__(self) -> None:
        self._recent_s: deque[float] = deque(maxlen=WARM_UPS)
        self.durations_us: list[float] = []

    def lead_s(self) -> float:
        """How long before a decision point its warm-up starts (s): the shortest of the last ``WARM_UPS``
        warm-ups (0 before any)."""
        return min(self._recent_s, default=0.0)

    def run(self, rehearse: Callable[[], None]) -> None:
        """``rehearse`` (the live state now and a throwaway decision at it), timed."""
        began_s = time.perf_counter()
        rehearse()
        took_s = time.perf_counter() - began_s
        self._recent_s.append(took_s)
        self.durations_us.append(took_s * 1e6)

    def figures(self) -> tuple[Quantiles, float]:
        """For the summary: the warm-ups' durations (us quantiles) and their total (ms)."""
        return quantiles(self.durations_us), 1e-3 * sum(self.durations_us)
