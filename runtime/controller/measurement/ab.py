"""Which windows run at auto ("A") and which under the policy ("B"): a balanced random order.

The windows come in blocks: one pair, an A and a B window in a random order (AB or BA, a fair coin per
block, seeded), then the extra windows of the more frequent arm that make the share of A windows
``share``: ``round(1 / share) - 2`` B windows for ``share <= 0.5`` (0.25: ``AB BB`` or ``BA BB``), or
``round(1 / (1 - share)) - 2`` A windows above it. Only the pair's two windows, adjacent in time, are
compared (:mod:`kdvfs.runtime.controller.measurement.estimator`): the drift between them is one window's worth, and
its sign is random, so it averages out. ``share == 0``: every window is B and nothing is measured.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

AUTO, CONTROLLED = "A", "B"


@dataclass(frozen=True)
class Slot:
    """One window of the schedule: its arm and its pair's number (None for an extra window)."""

    arm: str
    pair: int | None


class AbSchedule:
    """The arms of successive windows (see the module docstring)."""

    def __init__(self, share: float, seed: int = 0) -> None:
        self.share = share
        self._rng = random.Random(seed)
        if share <= 0:
            self._extra, self._extra_arm = 0, CONTROLLED
        elif share <= 0.5:
            self._extra, self._extra_arm = max(0, round(1 / share) - 2), CONTROLLED
        else:
            self._extra, self._extra_arm = max(0, round(1 / (1 - share)) - 2), AUTO
        self._block: list[Slot] = []
        self._pairs = 0

    @property
    def measuring(self) -> bool:
        return self.share > 0

    def _new_block(self) -> list[Slot]:
        if not self.measuring:
            return [Slot(CONTROLLED, None)]
        arms = [AUTO, CONTROLLED] if self._rng.random() < 0.5 else [CONTROLLED, AUTO]
        self._pairs += 1
        return [Slot(arm, self._pairs - 1) for arm in arms] + [Slot(self._extra_arm, None)] * self._extra

    def next(self) -> Slot:
        """The next window's slot."""
        if not self._block:
            self._block = self._new_block()
        return self._block.pop(0)
