"""The true effect of control on a :class:`~kdvfs.runtime.testing.fake_gpu.FakeGpu`, to check the measured one.

The fake knows what a drifting GPU cannot tell: each step's time and energy without drift or noise, the
cost model's for the clocks the step actually ran at; the true saving and slowdown are
those of the steps the A/B windows counted (from the run's ``window`` log records), B against A.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kdvfs.runtime.testing.fake_gpu import FakeGpu


@dataclass(frozen=True)
class TrueEffect:
    """Energy saved and slowdown (%) of the counted B steps against the counted A steps, drift undone."""

    energy_saved_pct: float
    slowdown_pct: float


def true_effect(gpu: FakeGpu, windows: Iterable[dict[str, Any]]) -> TrueEffect | None:
    """The true effect over the steps of ``windows`` (log records); None without both arms."""
    steps: dict[str, list[int]] = {"A": [], "B": []}
    for window in windows:
        if window["controlled_steps"] in (0, window["steps"]) and (window["controlled_steps"] > 0) == (
                window["arm"] == "B"):
            steps[window["arm"]].extend(range(window["first_step"], window["last_step"] + 1))
    if not steps["A"] or not steps["B"]:
        return None

    def clean(indices: list[int]) -> tuple[float, float]:
        runs = [gpu.steps[i] for i in indices]
        return float(np.mean([s.model_time_s for s in runs])), float(np.mean([s.model_energy_j for s in runs]))

    (auto_s, auto_j), (controlled_s, controlled_j) = clean(steps["A"]), clean(steps["B"])
    return TrueEffect((1 - controlled_j / auto_j) * 100, (controlled_s / auto_s - 1) * 100)
