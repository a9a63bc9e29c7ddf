"""The clock actions a learned policy chooses among: core-clock levels ("auto" first) by memory clocks.

A level is a fraction of the profile's maximum core clock, mapped at each memory clock onto the nearest
supported core clock; "auto" leaves the core clock to the firmware. Grid action ``g = level * M + memory``
(M memory clocks, highest first), so ``g = 0`` is the GPU's default behaviour (auto at the highest memory
clock). :meth:`ClockGrid.indices` maps grid actions onto a step's :class:`~kdvfs.envs.model.schedule.ActionCosts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.errors import ProfileError
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.schedule import ActionCosts

AUTO = "auto"


@dataclass(frozen=True)
class ClockGrid:
    """Core levels by memory clocks.

    Attributes:
        memory_mhz: (M,) memory clocks, descending.
        core_mhz: per core level (C,), per memory clock (M,): the locked core clock (MHz); level 0 is auto
            and holds None.
    """

    memory_mhz: tuple[int, ...]
    core_mhz: tuple[tuple[int | None, ...], ...]

    @classmethod
    def for_profile(cls, profile: GpuProfile, core_fractions: Sequence[float],
                    memory_mhz: Sequence[int] | None = None) -> ClockGrid:
        """Auto plus one level per fraction of the maximum core clock, at each memory clock.

        Args:
            profile: the GPU whose supported clocks the levels map onto.
            core_fractions: locked core levels as fractions of ``profile.clocks.max_core_mhz``, each mapped to
                the nearest supported core clock at each memory clock.
            memory_mhz: memory clocks to offer (descending); None offers all of the profile's.
        """
        memories = tuple(profile.clocks.memory_mhz if memory_mhz is None else memory_mhz)
        unknown = sorted(set(memories) - set(profile.clocks.memory_mhz))
        if unknown or list(memories) != sorted(set(memories), reverse=True) or not memories:
            raise ProfileError(f"memory clocks {list(memories)} must be distinct, descending and supported by "
                               f"{profile.name!r} ({list(profile.clocks.memory_mhz)})")
        if memories[0] != profile.clocks.memory_mhz[0]:
            raise ProfileError(f"memory clocks {list(memories)} must include the highest, "
                               f"{profile.clocks.memory_mhz[0]} MHz (the default behaviour)")
        if not core_fractions or not all(0.0 < f <= 1.0 for f in core_fractions):
            raise ProfileError(f"core fractions {list(core_fractions)} must be in (0, 1]")
        levels: list[tuple[int | None, ...]] = [(None,) * len(memories)]
        for fraction in core_fractions:
            target = fraction * profile.clocks.max_core_mhz
            levels.append(tuple(min(profile.clocks.core_mhz[m], key=lambda c: abs(c - target)) for m in memories))
        return cls(memories, tuple(levels))

    @property
    def levels(self) -> int:
        """C, the number of core levels (auto included)."""
        return len(self.core_mhz)

    @property
    def size(self) -> int:
        """G = C * M grid actions."""
        return self.levels * len(self.memory_mhz)

    def label(self, action: int) -> str:
        """``"1935:3201"`` or ``"auto:3201"``, as :meth:`kdvfs.envs.model.schedule.ActionCosts.label`."""
        level, memory = divmod(action, len(self.memory_mhz))
        core = self.core_mhz[level][memory]
        return f"{AUTO if core is None else core}:{self.memory_mhz[memory]}"

    def indices(self, costs: ActionCosts) -> Array:
        """(G,) the index in ``costs`` of each grid action; ``costs`` must be of the same profile."""
        try:
            indices = np.array([costs.index_of(self.label(g)) for g in range(self.size)], dtype=np.int64)
        except ValueError as error:
            raise ProfileError(f"clock grid does not match the step's GPU profile: {error}") from None
        if indices[0] != costs.auto_index:
            raise ProfileError(f"grid action 0 ({self.label(0)}) must be the default behaviour "
                               f"({costs.label(costs.auto_index)})")
        return indices

    def describe(self) -> dict[str, Any]:
        """Plain data that identifies the grid (part of the observation spec hash)."""
        return {"memory_mhz": list(self.memory_mhz), "core_mhz": [list(level) for level in self.core_mhz]}
