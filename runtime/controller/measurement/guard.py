"""The performance guard: backs off to auto when the measured slowdown shows the controlled steps over the budget."""

from __future__ import annotations

import math
from collections.abc import Callable

from kdvfs.runtime.controller.measurement.estimator import Interval

Estimate = Callable[[int], Interval | None]
"""``estimate(since)``: the measured slowdown (%) over the A/B windows from window number ``since`` on."""


class Guard:
    """The performance guard, on the same evidence as the measured saving: the run's slowdown estimate.

    ``estimate`` is the accounting's (:class:`~kdvfs.runtime.controller.measurement.accounting.Estimate`: the
    pairs' mean for a run of one shape, the adjusted estimate over the windows for steps that vary), and
    ``windows()`` the number of windows so far. At each new A/B pair (:meth:`observe`) it backs off when the
    lower end of the 95% interval of the slowdown, over the windows since control last (re)started and at least
    ``min_pairs`` of each arm, lies above ``budget + margin``: the controlled windows are slower than the budget
    allows with confidence, against auto windows measured alongside them, never against a stale baseline. While
    backed off every window runs at auto; after ``retry_s`` (doubled at each further back-off) control resumes
    with fresh evidence. In a dry run both arms run at auto, so the interval holds 0 and the guard does not fire.
    ``off`` (why, or None) keeps it from acting where the evidence is noise by construction (CPU test mode: step
    times are CPU times, which no clock changes): it still reads the slowdown, and never backs off.
    """

    OK, BACK_OFF, RESUME = "ok", "back-off", "resume"

    def __init__(self, budget: float, margin: float, min_pairs: int, retry_s: float, estimate: Estimate,
                 windows: Callable[[], int], off: str | None = None) -> None:
        self.limit = budget + margin
        """The slowdown (fraction) the interval's low end must exceed for a back-off."""
        self.min_pairs, self.retry_s = min_pairs, retry_s
        self._estimate, self._windows = estimate, windows
        self._since = 0
        self.off = off
        self.backoffs = 0
        self.backed_off = False
        self.reason = ""
        self._resume_s = math.inf

    def slowdown(self) -> Interval | None:
        """The slowdown (%) over the windows since control last (re)started."""
        return self._estimate(self._since)

    def observe(self, now_s: float) -> str:
        """A new A/B pair: ``OK`` or ``BACK_OFF`` (until :meth:`tick` says ``RESUME``)."""
        interval = self.slowdown()
        if self.off is not None or self.backed_off or interval is None or interval.n < self.min_pairs \
                or interval.lo <= self.limit:
            return self.OK
        self.backed_off, self.backoffs = True, self.backoffs + 1
        self._resume_s = now_s + self.retry_s * 2 ** (self.backoffs - 1)
        self.reason = (f"measured slowdown {interval.mean_pct:+.2f}% (95% interval {interval.lo_pct:+.2f} to "
                       f"{interval.hi_pct:+.2f}%, {interval.n} A/B pairs) exceeds the budget "
                       f"({self.limit:.2%} with noise margin)")
        return self.BACK_OFF

    def tick(self, now_s: float) -> str:
        """``RESUME`` once a back-off has lasted its time (control restarts with fresh evidence), else ``OK``."""
        if not self.backed_off or now_s < self._resume_s:
            return self.OK
        self.backed_off, self._since, self._resume_s = False, self._windows(), math.inf
        return self.RESUME
