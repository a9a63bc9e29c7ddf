"""The one interface kdvfs uses to a GPU: readings, clock locks and the permission check, units in the names.

:class:`~kdvfs.runtime.device.nvml_device.NvmlDevice` implements it over NVML;
:class:`~kdvfs.runtime.testing.fake_gpu.FakeGpu` implements it on the cost model and a virtual clock, for tests.
Code that changes clocks takes a :class:`Device` and is handed one explicitly: nothing swaps the real GPU for
the fake on its own.
"""

from __future__ import annotations

from typing import Protocol

from kdvfs.runtime.device.errors import UnsupportedClockError


class Device(Protocol):
    """One GPU. Clocks in MHz, power in W, energy in J.

    ``lock_clocks_mhz(core, mem)`` locks the memory clock at ``mem_mhz`` and the SM clock at ``core_mhz``
    (``None``: the SM clock is left to the GPU); ``reset_clocks`` returns both to the GPU's control.
    Implementations raise :class:`~kdvfs.runtime.device.errors.UnsupportedClockError` for a clock the GPU does not
    list, before changing anything.
    """

    index: int
    name: str

    def uuid(self) -> str:
        """The GPU's UUID (``GPU-...``), which no renumbering changes: the key of its lease
        (:mod:`kdvfs.runtime.device.lease`)."""
        ...

    def supported_clocks_mhz(self) -> dict[int, tuple[int, ...]]:
        """Supported SM clocks (ascending) per supported memory clock (descending), in MHz."""
        ...

    def clocks_mhz(self) -> tuple[float, float]:
        """The current (SM, memory) clocks in MHz."""
        ...

    def power_w(self) -> float:
        """The board's current power draw (W)."""
        ...

    def energy_j(self) -> float:
        """A cumulative energy counter (J): only differences between two reads mean anything."""
        ...

    def has_clock_permission(self) -> bool:
        """Whether this process may lock and reset clocks (reading needs no permission)."""
        ...

    def lock_clocks_mhz(self, core_mhz: int | None, mem_mhz: int) -> None:
        """Lock the memory clock at ``mem_mhz`` and the SM clock at ``core_mhz`` (None: the GPU picks it).

        Raises:
            UnsupportedClockError: a clock the GPU does not list (nothing changed);
            DeviceError: the device refused or failed the request.
        """
        ...

    def reset_clocks(self) -> None:
        """Return both clocks to the GPU's own control, whatever locked them.

        Raises:
            DeviceError: a reset failed (both are tried).
        """
        ...


def check_clocks_mhz(supported_mhz: dict[int, tuple[int, ...]], core_mhz: int | None, mem_mhz: int,
                     where: str) -> None:
    """Raise :class:`UnsupportedClockError` unless ``mem_mhz`` (and ``core_mhz`` at it) is supported."""
    if mem_mhz not in supported_mhz:
        raise UnsupportedClockError(f"{where} does not support a memory clock of {mem_mhz} MHz (it lists "
                                    f"{', '.join(map(str, supported_mhz))} MHz); use a plan or policy made for this "
                                    "GPU's profile (`kdvfs gpus local --write`)")
    cores = supported_mhz[mem_mhz]
    if core_mhz is not None and core_mhz not in cores:
        raise UnsupportedClockError(f"{where} does not support an SM clock of {core_mhz} MHz at memory {mem_mhz} MHz "
                                    f"(it lists {min(cores)}-{max(cores)} MHz in {len(cores)} steps); use a plan or "
                                    "policy made for this GPU's profile (`kdvfs gpus local --write`)")
