"""Lock and restore a GPU's clocks through NVML: the only kdvfs module that changes GPU state.

:class:`NvmlDevice` is the NVML implementation of :class:`kdvfs.runtime.device.interface.Device`: the read-only
readings of :class:`~kdvfs.runtime.device.nvml_info.GpuReader` plus locking the SM and memory clocks
(``nvmlDeviceSetGpuLockedClocks``, ``nvmlDeviceSetMemoryLockedClocks``) and returning them to the GPU
(``nvmlDeviceResetGpuLockedClocks``, ``nvmlDeviceResetMemoryLockedClocks``). Used by ``kdvfs calibrate
--sweep``, the clock controller (``kdvfs run`` without ``--dry-run``), its watchdog and ``kdvfs reset``,
each only after :func:`require_clock_permission` passed. :func:`locked_clocks` restores the clocks on exit,
on an exception and on SIGTERM. Power limits, persistence mode, application clocks and MIG are never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml

from kdvfs.runtime.device.errors import NvmlPermissionError, translate_nvml_error
from kdvfs.runtime.device.interface import check_clocks_mhz
from kdvfs.runtime.device.nvml_info import GpuReader

CAP_SYS_ADMIN = 21
SWEEP_NEEDS = "a clock sweep locks GPU clocks"
SWEEP_FIX = "run it as root, or run `kdvfs calibrate` without --sweep (read-only, default clocks)"


def has_clock_permission(euid: int | None = None, status: str | None = None) -> bool:
    """True for root or a process with CAP_SYS_ADMIN (what NVML requires to lock clocks).

    ``euid`` and ``status`` (the text of ``/proc/self/status``) default to this process's.
    """
    if (os.geteuid() if euid is None else euid) == 0:
        return True
    if status is None:
        proc = Path("/proc/self/status")
        status = proc.read_text(encoding="utf-8") if proc.is_file() else ""
    effective = next((line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), "0")
    return bool(int(effective, 16) >> CAP_SYS_ADMIN & 1)


def require_clock_permission(euid: int | None = None, status: str | None = None, needs: str = SWEEP_NEEDS,
                             fix: str = SWEEP_FIX, allowed: bool | None = None) -> None:
    """Raise :class:`NvmlPermissionError` (``needs``, which needs root or CAP_SYS_ADMIN; ``fix``) unless this
    process may lock clocks (``allowed``: what a device answered, instead of this process's credentials)."""
    if not (has_clock_permission(euid, status) if allowed is None else allowed):
        raise NvmlPermissionError(f"{needs}, which needs root or CAP_SYS_ADMIN; {fix}")


class NvmlDevice(GpuReader):
    """One GPU through NVML: readings (:class:`GpuReader`) plus clock locks. A context manager like its base.

    It remembers what it locked (``locked_mhz``: SM and memory clock, None where the GPU is in control) and
    skips a lock call for a clock that is already locked at the requested value.
    """

    def __init__(self, index: int = 0, nvml: types.ModuleType | None = None, check_energy: bool = True) -> None:
        super().__init__(index, nvml, check_energy)
        self.locked_mhz: tuple[int | None, int | None] = (None, None)
        self._supported: dict[int, tuple[int, ...]] | None = None

    @property
    def locked(self) -> bool:
        """True while any clock is locked by this device object."""
        return self.locked_mhz != (None, None)

    def has_clock_permission(self) -> bool:
        return has_clock_permission()

    def _set(self, action: str, name: str, *args: Any) -> None:
        try:
            getattr(self._nvml, name)(self._handle, *args)
        except pynvml.NVMLError as error:
            raise translate_nvml_error(error, f"{action} of GPU {self.index}", clock_request=True) from None

    def check_clocks_mhz(self, core_mhz: int | None, mem_mhz: int) -> None:
        """Raise :class:`~kdvfs.runtime.device.errors.UnsupportedClockError` for clocks this GPU does not list."""
        if self._supported is None:
            self._supported = self.supported_clocks_mhz()
        check_clocks_mhz(self._supported, core_mhz, mem_mhz, f"GPU {self.index} ({self.name})")

    def lock_clocks_mhz(self, core_mhz: int | None, mem_mhz: int) -> None:
        """Lock the memory clock at ``mem_mhz`` and the SM clock at ``core_mhz`` (None: the GPU picks it)."""
        self.check_clocks_mhz(core_mhz, mem_mhz)
        core_locked, mem_locked = self.locked_mhz
        if mem_locked != mem_mhz:
            self._set("lock the memory clock", "nvmlDeviceSetMemoryLockedClocks", mem_mhz, mem_mhz)
            self.locked_mhz = (core_locked, mem_mhz)
        if core_mhz is None and core_locked is not None:
            self._set("reset the SM clock", "nvmlDeviceResetGpuLockedClocks")
        elif core_mhz is not None and core_locked != core_mhz:
            self._set("lock the SM clock", "nvmlDeviceSetGpuLockedClocks", core_mhz, core_mhz)
        self.locked_mhz = (core_mhz, mem_mhz)

    def reset_clocks(self) -> None:
        """Return both clocks to the GPU's own control (whatever locked them)."""
        self._set("reset the SM clock", "nvmlDeviceResetGpuLockedClocks")
        self._set("reset the memory clock", "nvmlDeviceResetMemoryLockedClocks")
        self.locked_mhz = (None, None)

    def restore(self) -> None:
        """Return both clocks to the GPU's control when this object locked anything."""
        if self.locked:
            self.reset_clocks()


def reset_gpu_clocks(index: int, nvml: types.ModuleType | None = None) -> str:
    """Return GPU ``index``'s SM and memory clocks to its own control (``kdvfs reset``, the watchdog); its name."""
    with NvmlDevice(index, nvml, check_energy=False) as device:
        device.reset_clocks()
        return device.name


def _terminate(signum: int, frame: types.FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit`` inside the block (main thread only), so ``finally`` clauses run."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def locked_clocks(device: NvmlDevice) -> Iterator[NvmlDevice]:
    """Yield ``device``; restore the GPU's clocks on exit, on an exception and on SIGTERM."""
    with terminate_on_sigterm():
        try:
            yield device
        finally:
            device.restore()

