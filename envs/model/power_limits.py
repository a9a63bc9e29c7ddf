"""The two power limits a step is priced with: the one it was recorded under and the one it is priced at.

The recorded limit is the cap the GPU enforced while the trace was recorded: the trace's own
(``TraceMeta.power_limit_w``, read through NVML by ``kdvfs capture``) when it was recorded on a GPU the
profile applies to, else the profile's default (``power.limit_w``). It decides the clocks the recorded
kernels ran at in auto mode. The priced limit is the cap the step is priced under: the recorded one unless
another is asked for. With a lower priced limit, kernels that ran unconstrained at the recorded limit are
capped: they slow down and draw less power. The board's settable range is the trace's
(``power_limit_range_w``) on the same terms, else the profile's (``power.limit_range_w``); a priced limit
outside it is an error, since the GPU refuses it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.trace.trace import Trace

TRACE = "trace"
PROFILE_DEFAULT = "profile default"
REQUESTED = "requested"
"""Where a limit comes from: the trace's metadata, the GPU profile's default, or the caller."""


class PowerLimitError(KdvfsError):
    """A requested power limit outside the board's settable range."""


@dataclass(frozen=True)
class PowerLimits:
    """The power limits of one step on one GPU (W), each with where it comes from.

    Attributes:
        recorded_w: the limit the step was recorded under; recorded_source: :data:`TRACE` or
            :data:`PROFILE_DEFAULT`.
        priced_w: the limit the step is priced at; priced_source: ``recorded_source``, or :data:`REQUESTED`.
        range_w: ``(low, high)`` the board's settable range; range_source: :data:`TRACE` or :data:`PROFILE_DEFAULT`.
    """

    recorded_w: float
    recorded_source: str
    priced_w: float
    priced_source: str
    range_w: tuple[float, float]
    range_source: str

    def as_json(self) -> dict[str, Any]:
        """Every field, the range as a list."""
        return {"recorded_w": self.recorded_w, "recorded_source": self.recorded_source, "priced_w": self.priced_w,
                "priced_source": self.priced_source, "range_w": list(self.range_w), "range_source": self.range_source}

    def describe(self) -> str:
        """One line for a person: ``power limit 700 W (trace)``, or the priced and the recorded limit."""
        priced = f"power limit {self.priced_w:g} W ({self.priced_source})"
        if self.priced_w == self.recorded_w and self.priced_source == self.recorded_source:
            return priced
        return f"{priced}, recorded under {self.recorded_w:g} W ({self.recorded_source})"


def _trace_applies(trace: Trace, profile: GpuProfile) -> bool:
    """Whether the trace was recorded on a GPU the profile describes (so its limits are that GPU's)."""
    return profile.applies_to(trace.meta.gpu)


def power_limits(trace: Trace, profile: GpuProfile, priced_w: float | None = None) -> PowerLimits:
    """The recorded and priced limits of ``trace`` on ``profile`` (module docstring); ``priced_w`` None: the
    recorded one. Raises :class:`PowerLimitError` for a ``priced_w`` outside the board's range."""
    meta, own = trace.meta, _trace_applies(trace, profile)
    recorded = (meta.power_limit_w, TRACE) if own and meta.power_limit_w is not None else \
        (profile.power.limit_w, PROFILE_DEFAULT)
    bounds = (meta.power_limit_range_w, TRACE) if own and meta.power_limit_range_w is not None else \
        (profile.power.limit_range_w, PROFILE_DEFAULT)
    (low, high), range_source = bounds
    if priced_w is not None and not low <= priced_w <= high:
        raise PowerLimitError(f"power limit {priced_w:g} W is outside the board's range {low:g}-{high:g} W "
                              f"({range_source}); choose a limit within it")
    priced = recorded if priced_w is None else (float(priced_w), REQUESTED)
    return PowerLimits(float(recorded[0]), recorded[1], priced[0], priced[1], (float(low), float(high)), range_source)
