"""The paired estimate of what control does: energy saved and slowdown (%) with 95% intervals.

Each pair is one window at auto ("A") and the adjacent window under the policy ("B"), in a random order
(:mod:`kdvfs.runtime.controller.measurement.ab`). Its differences ``1 - J_B / J_A`` (joules per step) and
``s_B / s_A - 1`` (seconds per step) are nearly free of the GPU's drift, which moves both windows alike;
over the pairs the estimate is their mean with a Student-t interval, ``mean +- t(0.975, n - 1) * sd / sqrt(n)``.

Why a t-interval and not a block bootstrap: pairing has already removed the slow drift, so the pairs are
close to independent, and the t-interval is exact for normal differences and well calibrated from the
first few pairs, where a bootstrap of 3-10 pairs under-covers; it is also closed-form, so the live
estimate costs nothing per window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

MIN_PAIRS = 2


@dataclass(frozen=True)
class Interval:
    """A mean (%) with its 95% interval (%) over ``n`` pairs, and the mean's standard error (%)."""

    mean_pct: float
    lo_pct: float
    hi_pct: float
    n: int
    standard_error_pct: float

    @property
    def half_width_pct(self) -> float:
        return (self.hi_pct - self.lo_pct) / 2


class Paired:
    """Running mean and 95% Student-t interval of paired differences (%), updated one pair at a time."""

    def __init__(self) -> None:
        self.n, self._mean, self._m2 = 0, 0.0, 0.0

    def add(self, value_pct: float) -> None:
        """One more pair's difference (Welford's update)."""
        self.n += 1
        delta = value_pct - self._mean
        self._mean += delta / self.n
        self._m2 += delta * (value_pct - self._mean)

    def interval(self) -> Interval | None:
        """The mean and its interval (None before two pairs)."""
        if self.n < MIN_PAIRS:
            return None
        standard_error = math.sqrt(self._m2 / (self.n - 1) / self.n)
        half = float(stats.t.ppf(0.975, self.n - 1)) * standard_error
        return Interval(self._mean, self._mean - half, self._mean + half, self.n, standard_error)


def measured(saved: Interval | None, slow: Interval | None, windows_auto: int,
             windows_controlled: int) -> dict[str, object]:
    """The summary's ``measured`` figures: the effect while controlling."""
    return {
        "energy_saved_pct": None if saved is None else saved.mean_pct,
        "energy_saved_ci95_pct": None if saved is None else [saved.lo_pct, saved.hi_pct],
        "slowdown_pct": None if slow is None else slow.mean_pct,
        "slowdown_ci95_pct": None if slow is None else [slow.lo_pct, slow.hi_pct],
        "windows_auto": windows_auto, "windows_controlled": windows_controlled,
    }


def net(figures: dict[str, object], controlled_share: float) -> dict[str, object]:
    """The effect over the whole run, against a run entirely at auto: the effect while controlling times the
    share of steps that were controlled (auto windows, uncontrolled and settling steps save nothing)."""
    def scaled(value: object) -> object:
        if isinstance(value, list):
            return [v * controlled_share for v in value]
        return None if value is None else float(value) * controlled_share  # type: ignore[arg-type]

    return {"energy_saved_pct": scaled(figures["energy_saved_pct"]),
            "energy_saved_ci95_pct": scaled(figures["energy_saved_ci95_pct"]),
            "slowdown_pct": scaled(figures["slowdown_pct"]),
            "slowdown_ci95_pct": scaled(figures["slowdown_ci95_pct"]), "controlled_share": controlled_share}
