"""A fake NVML binding importable by name (``--nvml-module tests.runtime.nvml_fake``), also in child processes.

It is the recording :class:`~tests.runtime.device.test_nvml_info.FakeNvml` of the recorded H200, plus a
total-energy counter that grows at ``power_w`` watts (updating ``update_hz`` times a second, or at every
read when 0), SM and memory clocks, and the clock-locking functions (which it records and obeys). The
environment variable ``KDVFS_FAKE_NVML`` (JSON) configures it in a child: ``{"power_w": 400,
"failures": {"nvmlInit": 12}}``. Tests in the same process use :data:`FAKE` directly.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pynvml

from tests.runtime.device.test_nvml_info import FakeGpu, FakeNvml, h200_from_probe


class EnergyFakeNvml(FakeNvml):
    """FakeNvml with an energy counter, clock readings and clock locking."""

    def __init__(self, gpus: list[FakeGpu], power_w: float = 400.0, update_hz: float = 0.0) -> None:
        super().__init__(gpus)
        self.power_w, self.update_hz = power_w, update_hz
        self.locked: dict[str, int] = {}
        self._start_s = time.monotonic()

    def _nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
        elapsed_s = time.monotonic() - self._start_s
        if self.update_hz > 0:
            elapsed_s = int(elapsed_s * self.update_hz) / self.update_hz
        return int(1e9 + self.power_w * elapsed_s * 1000)

    def _nvmlDeviceGetClockInfo(self, gpu: FakeGpu, clock_type: int) -> int:
        if clock_type == pynvml.NVML_CLOCK_SM:
            return self.locked.get("core", gpu.max_graphics_mhz)
        assert clock_type == pynvml.NVML_CLOCK_MEM
        return self.locked.get("mem", gpu.default_app_memory_mhz)

    def _nvmlDeviceSetGpuLockedClocks(self, gpu: FakeGpu, low_mhz: int, high_mhz: int) -> None:
        self.locked["core"] = high_mhz

    def _nvmlDeviceSetMemoryLockedClocks(self, gpu: FakeGpu, low_mhz: int, high_mhz: int) -> None:
        self.locked["mem"] = high_mhz

    def _nvmlDeviceResetGpuLockedClocks(self, gpu: FakeGpu) -> None:
        self.locked.pop("core", None)

    def _nvmlDeviceResetMemoryLockedClocks(self, gpu: FakeGpu) -> None:
        self.locked.pop("mem", None)


def _from_environment() -> EnergyFakeNvml:
    options = json.loads(os.environ.get("KDVFS_FAKE_NVML", "{}"))
    fake = EnergyFakeNvml([h200_from_probe()], float(options.get("power_w", 400.0)))
    fake.state.failures.update({name: int(code) for name, code in options.get("failures", {}).items()})
    return fake


FAKE = _from_environment()


def fresh() -> EnergyFakeNvml:
    """The shared fake with its call log, injected failures and locked clocks cleared."""
    FAKE.state.calls.clear()
    FAKE.state.failures.clear()
    FAKE.locked.clear()
    return FAKE


def __getattr__(name: str) -> Any:
    return getattr(FAKE, name)
