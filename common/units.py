"""Units at kdvfs's edges: inside, times are seconds and budgets fractions; milliseconds and percent exist only
where people type or read them (CLI options, printed text, JSON keys named ``_ms``/``_pct``). The conversions
and the checks of a typed budget or latency are defined here once; each edge calls them, nothing inside does.
"""

from __future__ import annotations

import math

from kdvfs.common.errors import KdvfsError

MS_PER_S = 1e3
PCT_PER_FRACTION = 100.0

MAX_BUDGET = 0.5
"""Budgets are fractions of the auto step time; above this one is most likely a percentage typed as a number."""

MAX_LATENCY_MS = 10_000.0
"""The longest switching latency accepted (10 s): clock switches take micro- to milliseconds; more is a typo
or seconds typed as milliseconds' exponent."""


class UnitError(KdvfsError):
    """A budget or latency outside what it can be."""


def checked_budget(value: float) -> float:
    """``value`` as a budget (allowed step-time increase over auto, a fraction: 0.01 = 1%).

    Raises:
        UnitError: not finite, negative, or above :data:`MAX_BUDGET` (a percentage, most likely).
    """
    if not math.isfinite(value) or value < 0:
        raise UnitError(f"budget {value:g} must be a finite fraction >= 0 (0.01 = 1%)")
    if value > MAX_BUDGET:
        raise UnitError(f"budget {value:g} means a {value:.0%} slowdown; budgets are fractions (0.01 = 1%), at most "
                        f"{MAX_BUDGET:g}: did you mean {value / PCT_PER_FRACTION:g}?")
    return value


def checked_latency_s(latency_ms: float) -> float:
    """A switching latency typed in milliseconds, in seconds.

    Raises:
        UnitError: not finite or outside [0, :data:`MAX_LATENCY_MS`] ms.
    """
    if not math.isfinite(latency_ms) or not 0 <= latency_ms <= MAX_LATENCY_MS:
        raise UnitError(f"{latency_ms:g} ms is outside [0, {MAX_LATENCY_MS:g}] ms (switching latencies are micro- "
                        "to milliseconds)")
    return latency_ms / MS_PER_S
