"""Measure microbenchmarks in steady state: time per call, average power and clocks over a window.

Each benchmark is warmed up, its time per call estimated, then called back to back for ``duration_s``
while a :class:`~kdvfs.runtime.device.energy.WindowSampler` reads the NVML energy counter and clocks (the
counter updates ~10 times a second: windows of a few seconds). Idle power is measured the same way with
nothing running, before and after a CUDA context exists. Read-only: nothing here changes the GPU.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kdvfs.runtime.device.energy import Meter, WindowReading, WindowSampler
from kdvfs.runtime.microbench.microbench import Call, Features, Microbenchmark, microbenchmark_features

IDLE_FEATURES: Features = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Measurement:
    """One sweep row: a kernel class at the clocks it ran at (MHz), its time per call (s) and power (W)."""

    kernel: str
    core_mhz: float
    mem_mhz: float
    time_s: float
    power_w: float
    features: Features


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _calls_for(call: Call, device: torch.device, duration_s: float) -> int:
    """Warm ``call`` up and return how many back-to-back calls fill ``duration_s``."""
    call()
    _synchronize(device)
    start, count = time.perf_counter(), 0
    while time.perf_counter() - start < min(0.25, duration_s / 4) or count < 2:
        call()
        count += 1
        _synchronize(device)
    return max(1, round(duration_s * count / (time.perf_counter() - start)))


def time_calls(call: Call, device: torch.device, meter: Meter, duration_s: float) -> tuple[float, WindowReading]:
    """Seconds per call and the window's reading, for ``call`` run back to back for about ``duration_s``."""
    calls = _calls_for(call, device, duration_s)
    sampler = WindowSampler(meter)
    sampler.start()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    _synchronize(device)
    elapsed_s = time.perf_counter() - start
    return elapsed_s / calls, sampler.stop()


def measure_idle(name: str, meter: Meter, duration_s: float) -> Measurement:
    """The GPU doing nothing for ``duration_s``: a row with time 1 s and no utilisation."""
    sampler = WindowSampler(meter)
    sampler.start()
    time.sleep(duration_s)
    reading = sampler.stop()
    return Measurement(name, reading.sm_mhz, reading.mem_mhz, 1.0, reading.avg_power_w, IDLE_FEATURES)


def measure_benchmark(bench: Microbenchmark, device: torch.device, meter: Meter, duration_s: float,
                      scale: float = 1.0) -> Measurement:
    """One microbenchmark in steady state; its tensors are freed afterwards."""
    call = bench.build(device, scale)
    time_s, reading = time_calls(call, device, meter, duration_s)
    del call
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return Measurement(bench.name, reading.sm_mhz, reading.mem_mhz, time_s, reading.avg_power_w,
                       microbenchmark_features()[bench.name])


def measure_at_default_clocks(benches: Sequence[Microbenchmark], device: torch.device, meter: Meter,
                              duration_s: float, scale: float = 1.0,
                              progress: Callable[[Measurement], None] = lambda m: None) -> list[Measurement]:
    """Idle without and with a CUDA context, then every microbenchmark, each at the clocks the GPU chose."""
    rows = [measure_idle("idle", meter, duration_s)]
    torch.zeros(1, device=device)
    _synchronize(device)
    rows.append(measure_idle("idle_with_context", meter, duration_s))
    progress(rows[0])
    progress(rows[1])
    for bench in benches:
        rows.append(measure_benchmark(bench, device, meter, duration_s, scale))
        progress(rows[-1])
    return rows
