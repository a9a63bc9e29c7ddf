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

import statistics
from collections import deque

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
    """The performance guard: backs off when controlled steps run slower than the budget allows.

    The baseline is the median GPU step time of ``baseline_steps`` matching steps in auto mode, measured
    before the first clock change; the guard compares the median of the last ``guard_steps`` controlled
    steps with ``baseline * (1 + budget + margin)`` (``margin``: the noise of step times). A GPU's own auto
    step time drifts (it slows by ~2% while an H200 warms up), so the first excess only asks for a fresh
    baseline (:meth:`observe` answers ``REBASELINE``); the guard backs off when the controlled steps still
    exceed the budget against it.
    """

    OK, REBASELINE, BACK_OFF = "ok", "rebaseline", "back-off"

    def __init__(self, budget: float, margin: float, baseline_steps: int, guard_steps: int) -> None:
        self.limit = 1.0 + budget + margin
        self.baseline_steps = baseline_steps
        self._baseline: list[float] = []
        self._recent: deque[float] = deque(maxlen=guard_steps)
        self._confirming = False
        self.rebaselines = 0
        self.backed_off = False
        self.reason = ""

    @property
    def ready(self) -> bool:
        """True once the auto baseline is measured."""
        return len(self._baseline) >= self.baseline_steps

    @property
    def baseline_s(self) -> float | None:
        return statistics.median(self._baseline) if self._baseline else None

    def add_baseline(self, duration_s: float) -> None:
        """One matching step measured in auto mode."""
        if not self.ready:
            self._baseline.append(duration_s)

    def slowdown(self) -> float | None:
        """Median controlled step time over the baseline, minus one (None before either is measured)."""
        if not self._recent or not self._baseline:
            return None
        return statistics.median(self._recent) / statistics.median(self._baseline) - 1.0

    def observe(self, duration_s: float) -> str:
        """One controlled step: ``OK``, ``REBASELINE`` (measure the baseline again, in auto mode) or
        ``BACK_OFF`` (from now on)."""
        self._recent.append(duration_s)
        slowdown = self.slowdown()
        if self._recent.maxlen != len(self._recent) or slowdown is None:
            return self.OK
        if 1.0 + slowdown <= self.limit:
            self._confirming = False
            return self.OK
        if not self._confirming:
            self._confirming, self._baseline, self.rebaselines = True, [], self.rebaselines + 1
            self._recent.clear()
            return self.REBASELINE
        self.backed_off = True
        self.reason = (f"median step time {slowdown:+.2%} over a fresh auto baseline exceeds the budget "
                       f"({self.limit - 1:.2%} with noise margin)")
        return self.BACK_OFF
