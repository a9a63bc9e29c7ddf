"""Turn a finished profiler recording and its measurements into a kdvfs trace and a capture report.

Step detection, phase labelling and classification are :func:`kdvfs.envs.trace.importing.import_trace`'s (the
recording is in its default format, Kineto); this module adds what the capture measured (unprofiled step time,
joules per step, clocks, the enforced power limit and the board's range) to the trace's metadata.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kdvfs.common.files import read_text, write_text_atomic
from kdvfs.envs.trace.format import save_trace
from kdvfs.envs.trace.importing import Recording, read_recording, step_trace
from kdvfs.envs.trace.trace import Kind, Trace, noncommunication_s
from kdvfs.runtime.capture.capture_config import CaptureConfig
from kdvfs.runtime.capture.cpu_emulation import emulate_gpu_recording
from kdvfs.runtime.device.energy import WindowReading
from kdvfs.runtime.device.nvml_device import BoardPowerLimits
from kdvfs.runtime.job import JobGroup, Rank

CPU_TEST_GPU = "CPU (kdvfs capture --cpu-test-mode: leaf CPU ops stand in for kernels)"


@dataclass(frozen=True)
class StepTiming:
    """Wall time of the unprofiled measurement window and of the profiled steps.

    Attributes:
        window_s: length of the unprofiled window (s); window_steps: steps in it.
        profiled_s: wall time of the profiled steps (s); profiled_steps: their number.
        reading: energy and clocks over the unprofiled window, None without NVML (``--no-energy``).
        job_step_time_s: the job's unprofiled step time, the slowest rank's (s; this one's outside torchrun).
        rank: this process's place in the job.
        power: the power limit the GPU enforced and the board's range, read through NVML after the window; None
            without NVML or where the GPU does not report them.
    """

    window_s: float
    window_steps: int
    profiled_s: float
    profiled_steps: int
    reading: WindowReading | None
    job_step_time_s: float
    rank: Rank = dataclasses.field(default_factory=Rank)
    power: BoardPowerLimits | None = None

    @property
    def step_time_s(self) -> float:
        return self.window_s / self.window_steps

    @property
    def profiled_step_time_s(self) -> float:
        return self.profiled_s / self.profiled_steps

    def measurements(self) -> dict[str, float]:
        """The trace's ``meta.measurements``: seconds, joules and watts per step; the job's step time, rank
        and world size."""
        values = {"step_time_s": self.step_time_s, "profiled_step_time_s": self.profiled_step_time_s,
                  "window_s": self.window_s, "window_steps": float(self.window_steps),
                  "job_step_time_s": self.job_step_time_s, "rank": float(self.rank.rank),
                  "world_size": float(self.rank.world_size)}
        if self.reading is not None:
            values["energy_j_per_step"] = self.reading.avg_power_w * self.step_time_s
            values["avg_power_w"] = self.reading.avg_power_w
        return values


@dataclass(frozen=True)
class CaptureReport:
    """What ``kdvfs capture`` prints: the trace written and the figures of the capture (SI units)."""

    output: str
    workload: str
    gpu: str
    activities: int
    kernels: int
    step_time_s: float
    profiled_step_time_s: float
    overhead: float
    energy_j_per_step: float | None
    avg_power_w: float | None
    observed_core_mhz: float | None
    mem_mhz: float | None
    window_s: float
    window_steps: int
    kernels_with_counters: int = 0
    rank: int = 0
    world_size: int = 1
    job_step_time_s: float | None = None
    communication_s: float = 0.0
    shapes: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Steps that vary (:func:`kdvfs.runtime.capture.shape_rounds.shapes_report`): shapes seen, captured, missed."""
    power_limit_w: float | None = None

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def read_gpu_recording(profile: Path, config: CaptureConfig) -> Recording:
    """The profiler recording ``profile`` read (:func:`kdvfs.envs.trace.importing.read_recording`), in CPU test mode
    its CPU ops standing in for kernels. Reading parses the whole file (every recorded step): read each once."""
    if not config.cpu_test_mode:
        return read_recording(profile)
    emulated = profile.with_name(f"{profile.stem}.emulated.json")
    emulate_gpu_recording(profile, emulated)
    return read_recording(emulated)


def _scaled_to(trace: Trace, step_s: float) -> Trace:
    """The trace with every duration and gap scaled so the step lasts ``step_s`` (CPU test mode: profiled CPU
    ops are slower than unprofiled ones, so only the measured step time is what ``kdvfs run`` will see)."""
    scale = step_s / trace.step_time_s
    return replace(trace, kernels=tuple(replace(k, duration_s=k.duration_s * scale, gap_before_s=k.gap_before_s * scale)
                                        for k in trace.kernels))


def build_trace(recording: Recording, config: CaptureConfig, timing: StepTiming, gpu_name: str,
                job: JobGroup | None = None, step: int = -1) -> Trace:
    """Complete step ``step`` of the recording (:func:`read_gpu_recording`; default the last; a recording that
    starts at a step boundary, its first step kept: :func:`kdvfs.envs.trace.importing.split_steps`), with the
    capture's measurements and provenance; under torchrun (``job``) the longest time outside communication
    kernels over the ranks; the GPU's enforced power limit and range when the capture read them (``timing.power``)."""
    reading = timing.reading
    trace = step_trace(recording, step=step, leading_step=step != -1,
                         workload=config.workload,
                         measurements=timing.measurements(),
                         ref_mem_mhz=reading.mem_mhz if reading else None,
                         observed_core_mhz=reading.sm_mhz if reading else None)
    gpu = CPU_TEST_GPU if config.cpu_test_mode else gpu_name or trace.meta.gpu
    if config.cpu_test_mode:
        trace = _scaled_to(trace, timing.step_time_s)
    source = f"kdvfs capture --steps {config.steps} --warmup {config.warmup}: {config.command}".rstrip(": ")
    outside_s = noncommunication_s(trace)
    measurements = {**trace.meta.measurements, "communication_s": trace.communication_s,
                    "job_max_noncommunication_s": outside_s if job is None else job.max([outside_s])[0]}
    meta = replace(trace.meta, gpu=gpu, source=source, measurements=measurements)
    if timing.power is not None:
        meta = replace(meta, power_limit_w=timing.power.limit_w, power_limit_range_w=timing.power.range_w)
    return replace(trace, meta=meta)


def write_capture(trace: Trace, profile: Path, config: CaptureConfig, timing: StepTiming) -> CaptureReport:
    """Write the trace (and the raw recording when asked) atomically; return the report."""
    if config.keep_profile:
        write_text_atomic(Path(config.keep_profile), read_text(profile))
    save_trace(trace, Path(config.output))
    reading = timing.reading
    return CaptureReport(
        output=config.output, workload=trace.meta.workload, gpu=trace.meta.gpu, activities=len(trace),
        kernels=trace.count(Kind.KERNEL), step_time_s=timing.step_time_s,
        profiled_step_time_s=timing.profiled_step_time_s,
        overhead=timing.profiled_step_time_s / timing.step_time_s - 1.0,
        energy_j_per_step=trace.meta.measurements.get("energy_j_per_step"),
        avg_power_w=reading.avg_power_w if reading else None,
        observed_core_mhz=reading.sm_mhz if reading else None, mem_mhz=reading.mem_mhz if reading else None,
        window_s=timing.window_s, window_steps=timing.window_steps,
        kernels_with_counters=int(trace.has_features.sum()), rank=timing.rank.rank,
        world_size=timing.rank.world_size, job_step_time_s=timing.job_step_time_s,
        communication_s=trace.communication_s, power_limit_w=trace.meta.power_limit_w,
    )
