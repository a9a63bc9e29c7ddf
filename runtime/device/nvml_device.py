"""NVML, the one way kdvfs reaches a GPU: reading it (:func:`read_local_gpus`, :class:`GpuReader`) and setting
its clocks (:class:`NvmlDevice`).

Reading only initialises NVML, calls ``nvmlSystemGet*`` / ``nvmlDeviceGet*`` queries and shuts NVML down: it
changes no clock or power limit and needs no root. :class:`NvmlDevice`, the NVML implementation of
:class:`kdvfs.runtime.device.interface.Device`, is the only kdvfs code that changes GPU state: it locks the SM
and memory clocks (``nvmlDeviceSetGpuLockedClocks``, ``nvmlDeviceSetMemoryLockedClocks``) and returns them to
the GPU (``nvmlDeviceResetGpuLockedClocks``, ``nvmlDeviceResetMemoryLockedClocks``). ``kdvfs calibrate
--sweep``, the clock controller (``kdvfs run`` without ``--dry-run``), its watchdog and ``kdvfs reset`` use it,
each only after :func:`require_clock_permission` passed; :func:`locked_clocks` restores the clocks on exit, on
an exception and on SIGTERM. Power limits, persistence mode, application clocks and MIG are never touched.
Every NVML error becomes a kdvfs error through :func:`kdvfs.runtime.device.errors.translate_nvml_error`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import pynvml

from kdvfs.runtime.device.errors import (
    ClockRestoreError,
    DeviceError,
    NvmlNotSupportedError,
    NvmlPermissionError,
    NvmlUnavailableError,
    is_absent,
    translate_nvml_error,
)
from kdvfs.runtime.device.interface import check_clocks_mhz

CAP_SYS_ADMIN = 21
SWEEP_NEEDS = "a clock sweep locks GPU clocks"
SWEEP_FIX = "run it as root, or run `kdvfs calibrate` without --sweep (read-only, default clocks)"


@dataclass(frozen=True)
class LocalGpu:
    """What NVML says about one installed GPU. ``memory_clocks_mhz`` descending; core clocks ascending."""

    index: int
    name: str
    uuid: str
    driver_version: str
    memory_clocks_mhz: tuple[int, ...]
    core_clocks_mhz: Mapping[int, tuple[int, ...]]
    max_core_mhz: int
    default_memory_mhz: int
    power_limit_w: float
    power_limit_range_w: tuple[float, float]
    power_draw_w: float
    utilization_pct: int | None
    sm_count: int | None
    memory_total_bytes: int

    @property
    def is_idle(self) -> bool:
        """True when NVML reports 0% GPU utilisation, so ``power_draw_w`` is the idle power."""
        return self.utilization_pct == 0


@dataclass(frozen=True)
class BoardPowerLimits:
    """A GPU's power limits (W): the one it enforces now, and the ``(low, high)`` range it can be set to."""

    limit_w: float
    range_w: tuple[float, float]


def import_nvml(name: str = "pynvml") -> types.ModuleType:
    """The NVML binding module ``name`` (``pynvml``; tests name a fake), chosen explicitly by the caller."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise NvmlUnavailableError(f"cannot import the NVML binding {name!r} ({error}); install nvidia-ml-py or "
                                   "name an importable binding") from None


def _call(action: str, function: Callable[..., Any], *args: Any, clock_request: bool = False) -> Any:
    """Call one NVML function; an NVML error becomes the kdvfs error for ``action`` (``clock_request``: see
    :func:`~kdvfs.runtime.device.errors.translate_nvml_error`)."""
    try:
        return function(*args)
    except pynvml.NVMLError as error:
        raise translate_nvml_error(error, action, clock_request) from None


def _optional(action: str, function: Callable[..., Any], *args: Any) -> Any:
    """Like :func:`_call`, but None when this GPU or driver does not offer the fact."""
    try:
        return function(*args)
    except pynvml.NVMLError as error:
        if is_absent(error):
            return None
        raise translate_nvml_error(error, action) from None


def _clock_tables(nvml: types.ModuleType, handle: Any, where: str) -> dict[int, tuple[int, ...]]:
    """Supported core clocks (ascending) per supported memory clock, memory clocks descending."""
    memory_mhz = _call(f"read the supported memory clocks of {where}",
                       nvml.nvmlDeviceGetSupportedMemoryClocks, handle)
    if not memory_mhz:
        raise NvmlNotSupportedError(f"{where} reports no supported memory clocks; kdvfs needs a GPU whose "
                                    "clocks NVML can list (a full GPU, not a vGPU or MIG slice)")
    return {
        mem: tuple(sorted(set(_call(f"read the supported core clocks at memory {mem} MHz of {where}",
                                    nvml.nvmlDeviceGetSupportedGraphicsClocks, handle, mem))))
        for mem in sorted(set(memory_mhz), reverse=True)
    }


def _read_gpu(nvml: types.ModuleType, index: int, driver_version: str) -> LocalGpu:
    """Query one GPU by index."""
    where = f"GPU {index}"
    handle = _call(f"open {where}", nvml.nvmlDeviceGetHandleByIndex, index)
    clocks = _clock_tables(nvml, handle, where)
    default_mem = _optional(f"read the default memory clock of {where}",
                            nvml.nvmlDeviceGetDefaultApplicationsClock, handle, pynvml.NVML_CLOCK_MEM)
    low_mw, high_mw = _call(f"read the power-limit range of {where}",
                            nvml.nvmlDeviceGetPowerManagementLimitConstraints, handle)
    utilization = _optional(f"read the utilisation of {where}", nvml.nvmlDeviceGetUtilizationRates, handle)
    attributes = _optional(f"read the SM count of {where}", nvml.nvmlDeviceGetAttributes, handle)
    return LocalGpu(
        index=index,
        name=_call(f"read the name of {where}", nvml.nvmlDeviceGetName, handle),
        uuid=_call(f"read the UUID of {where}", nvml.nvmlDeviceGetUUID, handle),
        driver_version=driver_version,
        memory_clocks_mhz=tuple(clocks),
        core_clocks_mhz=types.MappingProxyType(clocks),
        max_core_mhz=int(_call(f"read the maximum core clock of {where}", nvml.nvmlDeviceGetMaxClockInfo,
                               handle, pynvml.NVML_CLOCK_GRAPHICS)),
        default_memory_mhz=default_mem if default_mem in clocks else max(clocks),
        power_limit_w=_call(f"read the power limit of {where}", nvml.nvmlDeviceGetPowerManagementLimit,
                            handle) / 1000.0,
        power_limit_range_w=(low_mw / 1000.0, high_mw / 1000.0),
        power_draw_w=_call(f"read the power draw of {where}", nvml.nvmlDeviceGetPowerUsage, handle) / 1000.0,
        utilization_pct=None if utilization is None else int(utilization.gpu),
        sm_count=None if attributes is None else int(attributes.multiprocessorCount),
        memory_total_bytes=int(_call(f"read the memory size of {where}", nvml.nvmlDeviceGetMemoryInfo,
                                     handle).total),
    )


def read_local_gpus(nvml: types.ModuleType | None = None) -> list[LocalGpu]:
    """Every installed GPU, in NVML index order.

    ``nvml`` is the NVML binding (``pynvml`` by default; tests pass a fake with the same function names).
    Raises :class:`~kdvfs.runtime.device.errors.NvmlUnavailableError` when no driver or NVML library is present.
    """
    nvml = pynvml if nvml is None else nvml
    _call("initialise NVML", nvml.nvmlInit)
    try:
        driver_version = _call("read the NVIDIA driver version", nvml.nvmlSystemGetDriverVersion)
        count = _call("count the GPUs", nvml.nvmlDeviceGetCount)
        return [_read_gpu(nvml, index, driver_version) for index in range(count)]
    finally:
        _call("shut NVML down", nvml.nvmlShutdown)


def read_gpu_uuids(nvml: types.ModuleType | None = None) -> list[str]:
    """The UUID of every installed GPU, in NVML index order (read only)."""
    nvml = pynvml if nvml is None else nvml
    _call("initialise NVML", nvml.nvmlInit)
    try:
        count = _call("count the GPUs", nvml.nvmlDeviceGetCount)
        return [str(_call(f"read the UUID of GPU {index}", nvml.nvmlDeviceGetUUID,
                          _call(f"open GPU {index}", nvml.nvmlDeviceGetHandleByIndex, index)))
                for index in range(count)]
    finally:
        _call("shut NVML down", nvml.nvmlShutdown)


class GpuReader:
    """Live readings of one GPU: its total-energy counter, power, SM and memory clocks, supported clocks.

    A context manager: NVML is initialised on entry (which fails early when the GPU has no energy counter,
    unless ``check_energy`` is False) and shut down on exit. ``nvml`` is the binding (``pynvml`` by default;
    tests pass a fake). NVML is thread-safe, so a background sampler may read while the caller does.
    """

    def __init__(self, index: int = 0, nvml: types.ModuleType | None = None, check_energy: bool = True) -> None:
        self.index = index
        self.name = ""
        self._nvml = pynvml if nvml is None else nvml
        self._handle: Any = None
        self._check_energy = check_energy

    def __enter__(self) -> Self:
        _call("initialise NVML", self._nvml.nvmlInit)
        try:
            self._handle = _call(f"open GPU {self.index}", self._nvml.nvmlDeviceGetHandleByIndex, self.index)
            self.name = str(_call(f"read the name of GPU {self.index}", self._nvml.nvmlDeviceGetName, self._handle))
            if self._check_energy:
                self.energy_j()
        except BaseException:
            _call("shut NVML down", self._nvml.nvmlShutdown)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        _call("shut NVML down", self._nvml.nvmlShutdown)

    def energy_j(self) -> float:
        """The GPU's total energy since the driver loaded (J); NVML counts millijoules."""
        return _call(f"read the total-energy counter of GPU {self.index}",
                     self._nvml.nvmlDeviceGetTotalEnergyConsumption, self._handle) / 1000.0

    def clocks_mhz(self) -> tuple[float, float]:
        """The current SM and memory clocks (MHz)."""
        sm = _call(f"read the SM clock of GPU {self.index}", self._nvml.nvmlDeviceGetClockInfo, self._handle,
                   pynvml.NVML_CLOCK_SM)
        mem = _call(f"read the memory clock of GPU {self.index}", self._nvml.nvmlDeviceGetClockInfo, self._handle,
                    pynvml.NVML_CLOCK_MEM)
        return float(sm), float(mem)

    def power_w(self) -> float:
        """The board's current power draw (W); NVML reports milliwatts."""
        return _call(f"read the power draw of GPU {self.index}", self._nvml.nvmlDeviceGetPowerUsage,
                     self._handle) / 1000.0

    def power_limits(self) -> BoardPowerLimits | None:
        """The power limit the GPU enforces and the board's settable range (W; NVML reports milliwatts), or None
        when this GPU or driver does not report them."""
        where, nvml = f"GPU {self.index}", self._nvml
        limit_mw = _optional(f"read the power limit of {where}", nvml.nvmlDeviceGetEnforcedPowerLimit, self._handle)
        bounds_mw = _optional(f"read the power-limit range of {where}",
                              nvml.nvmlDeviceGetPowerManagementLimitConstraints, self._handle)
        if limit_mw is None or bounds_mw is None:
            return None
        return BoardPowerLimits(limit_mw / 1000.0, (bounds_mw[0] / 1000.0, bounds_mw[1] / 1000.0))

    def supported_clocks_mhz(self) -> dict[int, tuple[int, ...]]:
        """Supported SM clocks (ascending) per supported memory clock (descending), in MHz."""
        return _clock_tables(self._nvml, self._handle, f"GPU {self.index}")

    def uuid(self) -> str:
        """The GPU's NVML UUID (``GPU-...``): the same whatever ``CUDA_VISIBLE_DEVICES`` says."""
        return str(_call(f"read the UUID of GPU {self.index}", self._nvml.nvmlDeviceGetUUID, self._handle))


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

    def _set(self, action: str, function: Callable[..., Any], *args: Any) -> None:
        _call(f"{action} of GPU {self.index}", function, self._handle, *args, clock_request=True)

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
            self._set("lock the memory clock", self._nvml.nvmlDeviceSetMemoryLockedClocks, mem_mhz, mem_mhz)
            self.locked_mhz = (core_locked, mem_mhz)
        if core_mhz is None and core_locked is not None:
            self._set("reset the SM clock", self._nvml.nvmlDeviceResetGpuLockedClocks)
        elif core_mhz is not None and core_locked != core_mhz:
            self._set("lock the SM clock", self._nvml.nvmlDeviceSetGpuLockedClocks, core_mhz, core_mhz)
        self.locked_mhz = (core_mhz, mem_mhz)

    def reset_clocks(self) -> None:
        """Return both clocks to the GPU's own control (whatever locked them).

        Both resets are tried even when the first fails; then :class:`ClockRestoreError` names the GPU, what
        failed and ``sudo kdvfs reset --gpu-index I``.
        """
        failures = []
        for action, function in (("reset the SM clock", self._nvml.nvmlDeviceResetGpuLockedClocks),
                                 ("reset the memory clock", self._nvml.nvmlDeviceResetMemoryLockedClocks)):
            try:
                self._set(action, function)
            except DeviceError as error:
                failures.append(str(error))
        if failures:
            raise restore_error(f"GPU {self.index} ({self.name})", self.index, failures)
        self.locked_mhz = (None, None)

    def restore(self) -> None:
        """Return both clocks to the GPU's control when this object locked anything."""
        if self.locked:
            self.reset_clocks()


def restore_error(where: str, index: int, failures: list[str], fix: str | None = None) -> ClockRestoreError:
    """The one-line error of a failed restore of GPU ``index`` (``where``: its name in the message; ``fix``:
    what to do, by default ``sudo kdvfs reset --gpu-index I``). Its ``failures`` keep the NVML errors."""
    fix = f"run `sudo kdvfs reset --gpu-index {index}`" if fix is None else fix
    error = ClockRestoreError(f"{where} may still be at locked clocks: {'; '.join(failures)}; {fix}")
    error.where, error.failures = where, failures
    return error


def reset_fix(index: int) -> str:
    """What to do when ``kdvfs reset`` itself failed (it was the advice: repeating it would not help)."""
    return (f"check that you run it as root (or with CAP_SYS_ADMIN), try `sudo nvidia-smi -i {index} -rgc -rmc`, "
            "and look for a GPU fault in `nvidia-smi -q` and the kernel log (`dmesg`)")


def gpu_count(nvml: types.ModuleType | None = None) -> int:
    """How many GPUs NVML reports."""
    nvml = pynvml if nvml is None else nvml
    _call("initialise NVML", nvml.nvmlInit)
    try:
        return int(_call("count the GPUs", nvml.nvmlDeviceGetCount))
    finally:
        _call("shut NVML down", nvml.nvmlShutdown)


def reset_gpu_clocks(index: int, nvml: types.ModuleType | None = None) -> str:
    """Return GPU ``index``'s SM and memory clocks to its own control (``kdvfs reset``, the watchdog); its name.

    Raises :class:`ClockRestoreError` when that failed, also when NVML could not be opened.
    """
    try:
        with NvmlDevice(index, nvml, check_energy=False) as device:
            device.reset_clocks()
            return device.name
    except ClockRestoreError:
        raise
    except DeviceError as error:
        raise restore_error(f"GPU {index}", index, [str(error)]) from None


class Termination:
    """The SIGTERM handler of :func:`terminate_on_sigterm`: ``SystemExit`` at once until :meth:`hold`, then at the
    block's end, so that a shutdown under way (a restore, a watchdog's stop) is not cut short by it."""

    def __init__(self) -> None:
        self.holding = False
        self.held = False

    def hold(self) -> None:
        """From now on a SIGTERM is only remembered: the block raises ``SystemExit`` when it ends."""
        self.holding = True

    def handle(self, signum: int, frame: types.FrameType | None) -> None:
        if not self.holding:
            raise SystemExit(128 + signum)
        self.held = True


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[Termination]:
    """Turn SIGTERM into ``SystemExit`` inside the block (main thread only), so ``finally`` clauses run; after
    :meth:`Termination.hold`, into ``SystemExit`` when the block ends without an exception of its own."""
    termination = Termination()
    previous = signal.signal(signal.SIGTERM, termination.handle)
    try:
        yield termination
    finally:
        signal.signal(signal.SIGTERM, previous)
    if termination.held:
        raise SystemExit(128 + signal.SIGTERM)


class Restorable(Protocol):
    """A device whose clocks :meth:`restore` returns to the GPU (this module's, or the daemon client's)."""

    def restore(self) -> None: ...


RestorableT = TypeVar("RestorableT", bound=Restorable)


@contextlib.contextmanager
def locked_clocks(device: RestorableT) -> Iterator[RestorableT]:
    """Yield ``device``; restore the GPU's clocks on exit, on an exception and on SIGTERM (one during the
    restore waits for it)."""
    with terminate_on_sigterm() as termination:
        try:
            yield device
        finally:
            termination.hold()
            device.restore()
