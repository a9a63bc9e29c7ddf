"""Is the running step the expected one?

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
