"""Read the installed NVIDIA GPUs through NVML: their facts (:func:`read_local_gpus`) and live readings of
one GPU's energy counter and clocks (:class:`GpuReader`).

READ-ONLY: this module only initialises NVML, calls ``nvmlSystemGet*`` / ``nvmlDeviceGet*`` queries and shuts
NVML down. It never calls an ``nvmlDeviceSet*`` or ``nvmlDeviceReset*`` function, so it cannot change a GPU's
clocks or power limit and needs no root. Every NVML error is translated by
:func:`kdvfs.runtime.device.errors.translate_nvml_error`.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import pynvml

from kdvfs.runtime.device.errors import NvmlNotSupportedError, NvmlUnavailableError, translate_nvml_error

# NVML codes meaning "this optional fact is not offered here" (a full H200 answers NOT_SUPPORTED for
# nvmlDeviceGetAttributes; an old driver lacks the function).
_ABSENT_CODES = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})


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


def import_nvml(name: str = "pynvml") -> types.ModuleType:
    """The NVML binding module ``name`` (``pynvml``; tests name a fake), chosen explicitly by the caller."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise NvmlUnavailableError(f"cannot import the NVML binding {name!r} ({error}); install nvidia-ml-py or "
                                   "name an importable binding") from None


def _call(action: str, function: Callable[..., Any], *args: Any) -> Any:
    """Call one NVML function; an NVML error becomes the kdvfs error for ``action``."""
    try:
        return function(*args)
    except pynvml.NVMLError as error:
        raise translate_nvml_error(error, action) from None


def _optional(action: str, function: Callable[..., Any], *args: Any) -> Any:
    """Like :func:`_call`, but None when this GPU or driver does not offer the fact."""
    try:
        return function(*args)
    except pynvml.NVMLError as error:
        if error.value in _ABSENT_CODES:
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

    def supported_clocks_mhz(self) -> dict[int, tuple[int, ...]]:
        """Supported SM clocks (ascending) per supported memory clock (descending), in MHz."""
        return _clock_tables(self._nvml, self._handle, f"GPU {self.index}")
