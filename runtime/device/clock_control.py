"""Lock and restore a GPU's clocks through NVML: the only kdvfs module that changes GPU state.

Used by ``kdvfs calibrate --sweep`` alone, and only after :func:`require_clock_permission` passed. Every
lock is undone by :meth:`ClockControl.restore` (``nvmlDeviceResetGpuLockedClocks`` and
``nvmlDeviceResetMemoryLockedClocks``), which :func:`locked_clocks` calls on exit, on an exception and on
SIGTERM. Power limits, persistence mode, application clocks and MIG are never touched.
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

from runtime.device.errors import NvmlPermissionError, translate_nvml_error

CAP_SYS_ADMIN = 21


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


def require_clock_permission(euid: int | None = None, status: str | None = None) -> None:
    """Raise :class:`NvmlPermissionError` unless this process may lock clocks."""
    if not has_clock_permission(euid, status):
        raise NvmlPermissionError("a clock sweep locks GPU clocks, which needs root or CAP_SYS_ADMIN; run it as "
                                  "root, or run `kdvfs calibrate` without --sweep (read-only, default clocks)")


class ClockControl:
    """Locks one GPU's SM and memory clocks; ``nvml`` is the binding (tests pass a fake). NVML must be open."""

    def __init__(self, index: int, nvml: types.ModuleType | None = None) -> None:
        self.index = index
        self._nvml = pynvml if nvml is None else nvml
        self._handle: Any = None
        self.locked = False

    def _call(self, action: str, name: str, *args: Any) -> None:
        try:
            getattr(self._nvml, name)(*args)
        except pynvml.NVMLError as error:
            raise translate_nvml_error(error, f"{action} of GPU {self.index}") from None

    def lock(self, core_mhz: int, mem_mhz: int) -> None:
        """Lock the SM clock and the memory clock at the given values (MHz)."""
        if self._handle is None:
            try:
                self._handle = self._nvml.nvmlDeviceGetHandleByIndex(self.index)
            except pynvml.NVMLError as error:
                raise translate_nvml_error(error, f"open GPU {self.index}") from None
        self._call("lock the memory clock", "nvmlDeviceSetMemoryLockedClocks", self._handle, mem_mhz, mem_mhz)
        self.locked = True
        self._call("lock the SM clock", "nvmlDeviceSetGpuLockedClocks", self._handle, core_mhz, core_mhz)

    def restore(self) -> None:
        """Return both clocks to the GPU's own control (when anything was locked)."""
        if not self.locked:
            return
        self._call("reset the SM clock", "nvmlDeviceResetGpuLockedClocks", self._handle)
        self._call("reset the memory clock", "nvmlDeviceResetMemoryLockedClocks", self._handle)
        self.locked = False


def _terminate(signum: int, frame: types.FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def locked_clocks(control: ClockControl) -> Iterator[ClockControl]:
    """Yield ``control``; restore the GPU's clocks on exit, on an exception and on SIGTERM."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield control
    finally:
        try:
            control.restore()
        finally:
            signal.signal(signal.SIGTERM, previous)
