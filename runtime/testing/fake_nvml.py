"""A fake NVML binding for tests: pynvml's function names over recorded NVML facts, raising real
``pynvml.NVMLError``s.

:class:`FakeNvml` serves the facts of its :class:`FakeNvmlGpu`s (``h200_from_probe()``: the H200 recorded in
``data/raw/h200/probe.json``), records every ``nvml*`` call and fails a call on request;
:class:`EnergyFakeNvml` adds a total-energy counter, clock readings and the clock locks (which it records and
obeys). :data:`READ_ONLY_CALL` matches the calls that only read. A process that must import a binding by
name uses :mod:`kdvfs.runtime.testing.nvml`.
"""

from __future__ import annotations

import functools
import json
import re
import time
import types
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import pynvml

from kdvfs.common.paths import RAW_DATA_DIR

READ_ONLY_CALL = re.compile(r"nvmlInit|nvmlShutdown|nvmlSystemGet\w+|nvmlDeviceGet\w+")


@dataclass
class FakeNvmlGpu:
    """One GPU's NVML facts in NVML's own units (MHz, mW, bytes)."""

    name: str
    memory_clocks_mhz: list[int]
    graphics_clocks_mhz: dict[int, list[int]]
    max_graphics_mhz: int
    default_app_memory_mhz: int
    power_limit_mw: int
    power_constraints_mw: list[int]
    power_usage_mw: int
    utilization_pct: int = 0
    sm_count: int | None = None  # None: NOT_SUPPORTED, as NVML answers for a full (non-MIG) GPU
    memory_total_bytes: int = 143_771 * 2**20
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"


@functools.cache
def h200_probe() -> dict[str, Any]:
    """The NVML facts recorded on a real H200 (``data/raw/h200/probe.json``)."""
    probe: dict[str, Any] = json.loads((RAW_DATA_DIR / "h200" / "probe.json").read_text(encoding="utf-8"))
    return probe


def h200_from_probe(number: int = 0) -> FakeNvmlGpu:
    """The recorded H200 as fake NVML facts; ``number`` makes its UUID (``GPU-...-00000000000N``)."""
    probe = h200_probe()
    return FakeNvmlGpu(
        name=probe["name"],
        memory_clocks_mhz=list(probe["mem_clocks"]),
        graphics_clocks_mhz={int(mem): list(cores) for mem, cores in probe["gfx_clocks"].items()},
        max_graphics_mhz=probe["max_clocks"]["sm"],
        default_app_memory_mhz=probe["default_app_clocks"]["mem"],
        power_limit_mw=probe["power_limit_mW"],
        power_constraints_mw=list(probe["power_constraints_mW"]),
        power_usage_mw=probe["idle_power_mW"],
        uuid=f"GPU-00000000-0000-0000-0000-{number:012d}",
    )


@dataclass
class _State:
    gpus: list[FakeNvmlGpu]
    calls: list[str] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    init_count: int = 0
    """``nvmlInit`` calls not yet matched by ``nvmlShutdown`` (NVML counts them: it shuts down at zero)."""

    @property
    def initialised(self) -> bool:
        return self.init_count > 0


class FakeNvml(types.ModuleType):
    """Stands in for the pynvml module: records every ``nvml*`` call; ``failures[name] = code`` makes it fail."""

    def __init__(self, gpus: list[FakeNvmlGpu]) -> None:
        super().__init__("fake_pynvml")
        self.state = _State(gpus)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if not name.startswith("nvml"):
            raise AttributeError(name)
        state, implementation = self.state, getattr(self, f"_{name}", None)

        def call(*args: Any) -> Any:
            state.calls.append(name)
            if name in state.failures:
                raise pynvml.NVMLError(state.failures[name])
            assert implementation is not None, f"kdvfs called {name}, which the fake does not offer"
            if name != "nvmlInit" and not state.initialised:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
            return implementation(*args)

        return call

    def _nvmlInit(self) -> None:
        self.state.init_count += 1

    def _nvmlShutdown(self) -> None:
        self.state.init_count -= 1

    def _nvmlSystemGetDriverVersion(self) -> str:
        return str(h200_probe()["driver"])

    def _nvmlDeviceGetCount(self) -> int:
        return len(self.state.gpus)

    def _nvmlDeviceGetHandleByIndex(self, index: int) -> FakeNvmlGpu:
        if not 0 <= index < len(self.state.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.state.gpus[index]

    def _nvmlDeviceGetName(self, gpu: FakeNvmlGpu) -> str:
        return gpu.name

    def _nvmlDeviceGetUUID(self, gpu: FakeNvmlGpu) -> str:
        return gpu.uuid

    def _nvmlDeviceGetSupportedMemoryClocks(self, gpu: FakeNvmlGpu) -> list[int]:
        return list(gpu.memory_clocks_mhz)

    def _nvmlDeviceGetSupportedGraphicsClocks(self, gpu: FakeNvmlGpu, memory_mhz: int) -> list[int]:
        return sorted(gpu.graphics_clocks_mhz[memory_mhz], reverse=True)  # NVML lists them highest first

    def _nvmlDeviceGetMaxClockInfo(self, gpu: FakeNvmlGpu, clock_type: int) -> int:
        assert clock_type == pynvml.NVML_CLOCK_GRAPHICS
        return gpu.max_graphics_mhz

    def _nvmlDeviceGetDefaultApplicationsClock(self, gpu: FakeNvmlGpu, clock_type: int) -> int:
        assert clock_type == pynvml.NVML_CLOCK_MEM
        return gpu.default_app_memory_mhz

    def _nvmlDeviceGetPowerManagementLimit(self, gpu: FakeNvmlGpu) -> int:
        return gpu.power_limit_mw

    def _nvmlDeviceGetEnforcedPowerLimit(self, gpu: FakeNvmlGpu) -> int:
        return gpu.power_limit_mw

    def _nvmlDeviceGetPowerManagementLimitConstraints(self, gpu: FakeNvmlGpu) -> list[int]:
        return list(gpu.power_constraints_mw)

    def _nvmlDeviceGetPowerUsage(self, gpu: FakeNvmlGpu) -> int:
        return gpu.power_usage_mw

    def _nvmlDeviceGetUtilizationRates(self, gpu: FakeNvmlGpu) -> types.SimpleNamespace:
        return types.SimpleNamespace(gpu=gpu.utilization_pct, memory=0)

    def _nvmlDeviceGetAttributes(self, gpu: FakeNvmlGpu) -> types.SimpleNamespace:
        if gpu.sm_count is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return types.SimpleNamespace(multiprocessorCount=gpu.sm_count)

    def _nvmlDeviceGetMemoryInfo(self, gpu: FakeNvmlGpu) -> types.SimpleNamespace:
        return types.SimpleNamespace(total=gpu.memory_total_bytes, free=gpu.memory_total_bytes, used=0)


class EnergyFakeNvml(FakeNvml):
    """FakeNvml with an energy counter, clock readings and clock locking."""

    def __init__(self, gpus: list[FakeNvmlGpu], power_w: float = 400.0, update_hz: float = 0.0) -> None:
        super().__init__(gpus)
        self.power_w, self.update_hz = power_w, update_hz
        self.locks: list[MutableMapping[str, int]] = [{} for _ in gpus]
        self._start_s = time.monotonic()

    @property
    def locked(self) -> MutableMapping[str, int]:
        """GPU 0's locked clocks (``"core"``, ``"mem"`` -> MHz)."""
        return self.locks[0]

    def _locks_of(self, gpu: FakeNvmlGpu) -> MutableMapping[str, int]:
        return self.locks[next(i for i, known in enumerate(self.state.gpus) if known is gpu)]

    def _nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeNvmlGpu) -> int:
        elapsed_s = time.monotonic() - self._start_s
        if self.update_hz > 0:
            elapsed_s = int(elapsed_s * self.update_hz) / self.update_hz
        return int(1e9 + self.power_w * elapsed_s * 1000)

    def _nvmlDeviceGetClockInfo(self, gpu: FakeNvmlGpu, clock_type: int) -> int:
        if clock_type == pynvml.NVML_CLOCK_SM:
            return self._locks_of(gpu).get("core", gpu.max_graphics_mhz)
        assert clock_type == pynvml.NVML_CLOCK_MEM
        return self._locks_of(gpu).get("mem", gpu.default_app_memory_mhz)

    def _nvmlDeviceSetGpuLockedClocks(self, gpu: FakeNvmlGpu, low_mhz: int, high_mhz: int) -> None:
        self._locks_of(gpu)["core"] = high_mhz

    def _nvmlDeviceSetMemoryLockedClocks(self, gpu: FakeNvmlGpu, low_mhz: int, high_mhz: int) -> None:
        self._locks_of(gpu)["mem"] = high_mhz

    def _nvmlDeviceResetGpuLockedClocks(self, gpu: FakeNvmlGpu) -> None:
        self._locks_of(gpu).pop("core", None)

    def _nvmlDeviceResetMemoryLockedClocks(self, gpu: FakeNvmlGpu) -> None:
        self._locks_of(gpu).pop("mem", None)
