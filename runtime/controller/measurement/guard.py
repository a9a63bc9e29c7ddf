"""The performance guard: backs off to auto when the A/B pairs show the controlled steps over the budget."""

from __future__ import annotations

import math

from kdvfs.runtime.controller.measurement.estimator import Interval, Paired


class Guard:
    """The performance guard, on the same evidence as the measured saving: the A/B pairs' slowdowns.

    It backs off when the lower end of the 95% interval of the slowdown, over the pairs since control last
    (re)started and at least ``min_pairs`` of them, lies above ``budget + margin``: the controlled windows
    are slower than the budget allows with confidence, against auto windows measured alongside them, never
    against a stale baseline. While backed off every window runs at auto; after ``retry_s`` (doubled at
    each further back-off) control resumes with fresh evidence. In a dry run both arms run at auto, so the
    interval holds 0 and the guard does not fire. ``off`` (why, or None) keeps it from acting where the
    evidence is noise by construction (CPU test mode: step times are CPU times, which no clock changes): it
    still gathers the slowdown, and never backs off.
    """

    OK, BACK_OFF, RESUME = "ok", "back-off", "resume"

    def __init__(self, budget: float, margin: float, min_pairs: int, retry_s: float, off: str | None = None) -> None:
        self.limit_pct = (budget + margin) * 100
        self.min_pairs, self.retry_s = min_pairs, retry_s
        self.evidence = Paired()
        self.backoffs = 0
        self.backed_off = False
        self.reason = ""
        self.off = off
        self._resume_s = math.inf

    def slowdown(self) -> Interval | None:
        """The slowdown (%) over the pairs since control last (re)started."""
        return self.evidence.interval()

    def observe(self, slowdown_pct: float, now_s: float) -> str:
        """One more A/B pair's slowdown (%): ``OK`` or ``BACK_OFF`` (until :meth:`tick` says ``RESUME``)."""
        self.evidence.add(slowdown_pct)
        interval = self.evidence.interval()
        if self.off is not None or self.backed_off or interval is None or interval.n < self.min_pairs \
                or interval.lo_pct <= self.limit_pct:
            return self.OK
        self.backed_off, self.backoffs = True, self.backoffs + 1
        self._resume_s = now_s + self.retry_s * 2 ** (self.backoffs - 1)
        self.reason = (f"measured slowdown {interval.mean_pct:+.2f}% (95% interval {interval.lo_pct:+.2f} to "
                       f"{interval.hi_pct:+.2f}%, {interval.n} A/B pairs) exceeds the budget "
                       f"({self.limit_pct:.2f}% with noise margin)")
        return self.BACK_OFF

    def tick(self, now_s: float) -> str:
        """``RESUME`` once a back-off has lasted its time (control restarts with fresh evidence), else ``OK``."""
        if not self.backed_off or now_s < self._resume_s:
            return self.OK
        self.backed_off, self.evidence, self._resume_s = False, Paired(), math.inf
        return self.RESUME
