"""Is the running step the expected one?

:class:`StepMatcher` checks two cheap signals at every step boundary: the step's GPU time (s) must be within
``tolerance`` of the expected step time, and the number of allocations the CUDA caching allocator served in
the step must equal the count learned from the first matching steps (a structural fingerprint of the launch
sequence; a count that persists for ``RELEARN_STEPS`` matching-time steps replaces it). The controller acts
only after ``confirm_steps`` consecutive matches and returns the GPU to auto at the first mismatch. Why not a
kernel-by-kernel comparison: docs/design/controller.md.

A step longer than the tolerance still matches when its allocation count is the learned one and the median
time of the last ``RECENT_STEPS`` steps is within the tolerance: the same launches held up by the host (a
launch-bound stretch slowed by a pause, a collection, another thread), not another step. A step with more work
on the same allocations (larger shapes) moves the median within a few steps; a shorter step (less work) and a
step whose time is unknown never match.
"""

from __future__ import annotations

import statistics
from collections import deque

RELEARN_STEPS = 20
RECENT_STEPS = 5


class StepMatcher:
    """Decides, step by step, whether the steps match the expected one (docs/design/controller.md)."""

    def __init__(self, expected_s: float, tolerance: float, confirm_steps: int) -> None:
        self.expected_s, self.tolerance, self.confirm_steps = expected_s, tolerance, confirm_steps
        self.signature: int | None = None
        self.streak = 0
        self.mismatches = 0
        self._candidate: tuple[int | None, int] = (None, 0)
        self._recent: deque[float] = deque(maxlen=RECENT_STEPS)
        """The last steps' times over the expected one (every step whose time is known, matching or not)."""

    def _learn(self, signature: int) -> None:
        candidate, count = self._candidate
        count = count + 1 if candidate == signature else 1
        self._candidate = (signature, count)
        if (self.signature is None and count >= self.confirm_steps) or count >= RELEARN_STEPS:
            self.signature = signature

    def observe(self, duration_s: float | None, signature: int | None) -> bool:
        """Record one step (its GPU time, None when unknown, and its allocation count, None when not
        counted); True when it and the ``confirm_steps - 1`` steps before it matched."""
        ratio = None if duration_s is None else duration_s / self.expected_s
        if ratio is not None:
            self._recent.append(ratio)
        ok = ratio is not None and (abs(ratio - 1.0) <= self.tolerance or self._held_up(ratio, signature))
        if ok and signature is not None:
            self._learn(signature)
            ok = self.signature is None or signature == self.signature
        if ok:
            self.streak += 1
        else:
            self.mismatches += self.streak >= self.confirm_steps
            self.streak = 0
        return self.streak >= self.confirm_steps

    def _held_up(self, ratio: float, signature: int | None) -> bool:
        """Whether a step ``ratio`` times the expected one, out of tolerance, is the expected step held up on the
        host: longer, with the learned allocation count, among recent steps whose median is within tolerance."""
        return (ratio > 1.0 and signature is not None and signature == self.signature
                and len(self._recent) == RECENT_STEPS
                and abs(statistics.median(self._recent) - 1.0) <= self.tolerance)
