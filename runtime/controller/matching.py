"""Is the running step the expected one, and is the schedule within its time budget?

Step matching is by two cheap signals taken at every step boundary (the optimizer-step hook):

* the step's GPU time, from CUDA events recorded at consecutive boundaries, must be within
  ``tolerance`` of the expected step time. An evaluation pass between two optimizer steps, a new batch or
  sequence shape, a different model all change it;
* the number of allocations the CUDA caching allocator served during the step (one counter read, no GPU
  sync) must equal the count learned from the first matching steps. It is a structural fingerprint of the
  launch sequence: the same ops on the same shapes allocate the same number of tensors, while an extra
  forward pass, another shape bucket or a changed graph does not. A count that persists for
  ``RELEARN_STEPS`` matching-time steps replaces the learned one (the first ones may have been transient).

A kernel-by-kernel comparison would need the profiler or CUPTI callbacks on every launch, which costs far
more than the 1% the controller may spend. The controller acts only after ``confirm_steps`` consecutive
matches, and returns the GPU to auto at the first mismatch.
"""

from __future__ import annotations

import math

from kdvfs.runtime.controller.estimator import Interval, Paired

RELEARN_STEPS = 20


class StepMatcher:
    """Decides, step by step, whether the steps match the expected one (see the module docstring)."""

    def __init__(self, expected_s: float, tolerance: float, confirm_steps: int) -> None:
        self.expected_s, self.tolerance, self.confirm_steps = expected_s, tolerance, confirm_steps
        self.signature: int | None = None
        self.streak = 0
        self.mismatches = 0
        self._candidate: tuple[int | None, int] = (None, 0)

    def _learn(self, signature: int) -> None:
        candidate, count = self._candidate
        count = count + 1 if candidate == signature else 1
        self._candidate = (signature, count)
        if (self.signature is None and count >= self.confirm_steps) or count >= RELEARN_STEPS:
            self.signature = signature

    def observe(self, duration_s: float | None, signature: int | None) -> bool:
        """Record one step (its GPU time, None when unknown, and its allocation count, None when not
        counted); True when it and the ``confirm_steps - 1`` steps before it matched."""
        ok = duration_s is not None and abs(duration_s / self.expected_s - 1.0) <= self.tolerance
        if ok and signature is not None:
            self._learn(signature)
            ok = self.signature is None or signature == self.signature
        if ok:
            self.streak += 1
        else:
            self.mismatches += self.streak >= self.confirm_steps
            self.streak = 0
        return self.streak >= self.confirm_steps


class Guard:
    """The performance guard, on the same evidence as the measured saving: the A/B pairs' slowdowns.

    It backs off when the lower end of the 95% interval of the slowdown, over the pairs since control last
    (re)started and at least ``min_pairs`` of them, lies above ``budget + margin``: the controlled windows
    are slower than the budget allows with confidence, against auto windows measured alongside them, never
    against a stale baseline. While backed off every window runs at auto; after ``retry_s`` (doubled at
    each further back-off) control resumes with fresh evidence. In a dry run both arms run at auto, so the
    interval holds 0 and the guard does not fire.
    """

    OK, BACK_OFF, RESUME = "ok", "back-off", "resume"

    def __init__(self, budget: float, margin: float, min_pairs: int, retry_s: float) -> None:
        self.limit_pct = (budget + margin) * 100
        self.min_pairs, self.retry_s = min_pairs, retry_s
        self.evidence = Paired()
        self.backoffs = 0
        self.backed_off = False
        self.reason = ""
        self._resume_s = math.inf

    def slowdown(self) -> Interval | None:
        """The slowdown (%) over the pairs since control last (re)started."""
        return self.evidence.interval()

    def observe(self, slowdown_pct: float, now_s: float) -> str:
        """One more A/B pair's slowdown (%): ``OK`` or ``BACK_OFF`` (until :meth:`tick` says ``RESUME``)."""
        self.evidence.add(slowdown_pct)
        interval = self.evidence.interval()
        if self.backed_off or interval is None or interval.n < self.min_pairs or interval.lo_pct <= self.limit_pct:
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
