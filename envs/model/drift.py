"""A seeded model of how a real GPU's step drifts and jitters, for simulations with a known truth.

Without clock control a GPU's joules and seconds per step rise as it warms and its power limiter lowers the
clock, and adjacent windows of steps differ by noise. :class:`DriftModel` holds the size of both (its defaults
are an H200's without clock control; the run they come from is in ``docs/results.md``); :class:`Drift` turns
them into one factor on the time and one on the energy of each step, whatever clocks it runs at:

* thermal drift ``rise * (1 - exp(-t / drift_s))``, with ``rise`` such that the drift reaches
  ``*_drift_pct`` at ``t = drift_s`` (a warm-up that levels off rather than a line that grows forever);
* independent noise per step, its standard deviation chosen so that the means of two adjacent windows of
  ``window_steps`` steps differ by ``*_window_sd_pct``: ``sd_step = sd_diff * sqrt(window_steps / 2)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DriftModel:
    """Drift and noise of a GPU's step (see the module docstring); defaults are the H200 figures."""

    energy_drift_pct: float = 2.1
    time_drift_pct: float = 2.1
    drift_s: float = 120.0
    energy_window_sd_pct: float = 0.4
    time_window_sd_pct: float = 0.2
    window_steps: int = 10
    seed: int = 0

    def drift_pct(self, elapsed_s: float) -> tuple[float, float]:
        """Thermal drift of (time, energy) per step after ``elapsed_s`` seconds, in percent."""
        shape = (1.0 - math.exp(-elapsed_s / self.drift_s)) / (1.0 - math.exp(-1.0))
        return self.time_drift_pct * shape, self.energy_drift_pct * shape

    def step_sd_pct(self) -> tuple[float, float]:
        """Standard deviation of one step's (time, energy) noise, in percent."""
        scale = math.sqrt(self.window_steps / 2.0)
        return self.time_window_sd_pct * scale, self.energy_window_sd_pct * scale


class Drift:
    """Draws the (time, energy) factors of successive steps from a :class:`DriftModel`, seeded."""

    def __init__(self, model: DriftModel) -> None:
        self.model = model
        self._rng = np.random.default_rng(model.seed)
        self._sd_pct = model.step_sd_pct()

    def factors(self, elapsed_s: float) -> tuple[float, float]:
        """Multipliers of the time and the energy of a step that starts ``elapsed_s`` into the run."""
        drift_time_pct, drift_energy_pct = self.model.drift_pct(elapsed_s)
        noise_time, noise_energy = self._rng.standard_normal(2)
        return ((1.0 + drift_time_pct / 100) * (1.0 + noise_time * self._sd_pct[0] / 100),
                (1.0 + drift_energy_pct / 100) * (1.0 + noise_energy * self._sd_pct[1] / 100))
