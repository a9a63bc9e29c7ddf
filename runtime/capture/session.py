"""Record training steps of the running process into a kdvfs trace: the capture's Python API.

In the style of ``torch.profiler.profile``: call :meth:`Capture.step` once at the end of every training
step (``kdvfs capture`` does it from a ``torch.optim`` optimizer-step hook); it returns True when done::

    with Capture("step.trace.json", steps=2, warmup=5) as capture:
        for batch in loader:
            train_step(batch)
            if capture.step():
                break

Stages: ``warmup`` steps untouched; a window of unprofiled steps (at least ``energy_window_s``) measures the
step time (s), joules per step, clocks and power limits through NVML; the profiler then records a warm-up step
and ``steps`` steps, the last complete one becoming the trace, written atomically and only if every stage
completed. Steps of several shapes (:attr:`Capture.probe`) are profiled in rounds, one trace per shape
(:mod:`kdvfs.runtime.capture.shape_rounds`). Under torchrun each rank writes its own ``.rankR`` trace, the
ranks agreeing through :class:`kdvfs.runtime.job.JobGroup` on the window's end. How: ``docs/guide/capture.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
import types
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from kdvfs.runtime.capture import shape_rounds
from kdvfs.runtime.capture.capture_config import CaptureConfig
from kdvfs.runtime.capture.capture_errors import CaptureError
from kdvfs.runtime.capture.recording import CaptureReport, StepTiming, build_trace, read_gpu_recording, write_capture
from kdvfs.runtime.capture.shape_set import write_shape_set
from kdvfs.runtime.device.energy import WindowReading, WindowSampler
from kdvfs.runtime.device.errors import NvmlUnavailableError
from kdvfs.runtime.device.nvml_device import BoardPowerLimits, GpuReader, import_nvml
from kdvfs.runtime.device.visible import rank_gpu_index
from kdvfs.runtime.job import JobGroup, Rank, rank_path
from kdvfs.runtime.step_shapes import ShapeProbe

MIN_WINDOW_STEPS = 3
NO_CUDA = ("no CUDA kernels recorded: the script ran on the CPU (PyTorch had not initialised CUDA by the end of "
           "its first training step); move the model and data to the GPU (e.g. --device cuda), or try the "
           "capture on the CPU with --cpu-test-mode")
OFF_GPU_HINTS = {
    False: "off a GPU, try the CPU test mode: --cpu-test-mode --nvml-module kdvfs.runtime.testing.nvml (a fake "
           "NVML; for tests and dry runs, its figures are not a GPU's)",
    True: "in CPU test mode off a GPU, use the fake NVML (--nvml-module kdvfs.runtime.testing.nvml) or --no-energy"}
"""What a capture without NVML (no NVIDIA driver) tells the user to try, by whether it is in CPU test mode."""


class Stage(StrEnum):
    """Where a capture is: see the module docstring."""

    WARMUP = "warmup"
    WINDOW = "window"
    PROFILER_WARMUP = "profiler-warmup"
    PROFILE = "profile"
    SHAPES = "shapes"
    DONE = "done"


_synchronize = shape_rounds.synchronize


class Capture:
    """A capture of ``steps`` training steps into the kdvfs trace ``output`` (options: :class:`CaptureConfig`).

    ``nvml`` is the NVML binding for the energy measurement (default: the module ``nvml_module`` names).
    After completion, :attr:`report` holds the figures.
    """

    def __init__(self, output: str | Path, nvml: types.ModuleType | None = None, **options: Any) -> None:
        self.config = CaptureConfig(output=str(output), **options)
        self.rank = Rank.from_environment()
        if self.rank.distributed:
            keep = self.config.keep_profile
            self.config = dataclasses.replace(self.config, output=str(rank_path(output, self.rank.rank)),
                                              keep_profile=str(rank_path(keep, self.rank.rank)) if keep else None)
        self._job: JobGroup | None = None
        self.stage = Stage.WARMUP
        self.steps_seen = 0
        self.report: CaptureReport | None = None
        self._nvml = nvml
        self._stack = contextlib.ExitStack()
        self._folder = Path()
        self._reader: GpuReader | None = None
        self._sampler: WindowSampler | None = None
        self._profiler: profile | None = None
        self._mark_s = 0.0
        self._now_s = time.thread_time if self.config.cpu_test_mode else time.perf_counter
        self._counted = 0
        self._window: tuple[float, int, WindowReading | None] = (0.0, 0, None)
        self._power: BoardPowerLimits | None = None
        self._job_step_s = 0.0
        self.probe = ShapeProbe()
        self._clock = shape_rounds.StepClock(self._now_s, cuda=False)
        self._window_steps: list[int] = []
        self._shapes = shape_rounds.WindowShapes((), ())
        self._rounds: shape_rounds.ShapeRounds | None = None

    @classmethod
    def from_config(cls, config: CaptureConfig, nvml: types.ModuleType | None = None) -> Capture:
        options = {k: v for k, v in vars(config).items() if k != "output"}
        return cls(config.output, nvml, **options)

    def __enter__(self) -> Capture:
        self._folder = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="kdvfs-capture-")))
        if self.config.measure_energy:
            try:
                nvml = self._nvml or import_nvml(self.config.nvml_module)
                index = rank_gpu_index(nvml) if self.config.gpu_index is None else self.config.gpu_index
                self._reader = self._stack.enter_context(GpuReader(index, nvml))
            except NvmlUnavailableError as error:
                raise NvmlUnavailableError(f"{error}; {OFF_GPU_HINTS[self.config.cpu_test_mode]}") from None
            self._sampler = WindowSampler(self._reader)
        if self.rank.distributed:
            self._job = JobGroup(self.rank)
            self._stack.callback(self._job.close)
        self._stack.callback(self.probe.remove)
        self.probe.install()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: types.TracebackType | None) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        if self._profiler is not None:
            with contextlib.suppress(RuntimeError):
                self._profiler.stop()
            self._profiler = None
        if self._rounds is not None:
            self._rounds.stop()
        self._stack.close()
        if kind is None and self.stage is not Stage.DONE:
            raise CaptureError(self._incomplete())

    def _incomplete(self) -> str:
        needed = f"{self.config.warmup} warm-up, >= {self.config.energy_window_s:g} s of measured and " \
                 f"{self.config.steps + 1} profiled steps"
        if self.steps_seen == 0:
            return ("the script ended without reaching a step boundary (no torch.optim optimizer step); kdvfs "
                    "capture finds training steps by optimizer.step(): use a torch.optim optimizer, or mark steps "
                    "with kdvfs.runtime.capture.session.Capture.step()")
        if self.stage is Stage.SHAPES:
            return (f"the script ended after {self.steps_seen} training steps, while profiling its step shapes (up "
                    f"to {self.config.max_profiled_steps} steps, a warm-up step per {shape_rounds.ROUND_STEPS}): let "
                    "the script run longer, or lower --max-profiled-steps or --shapes")
        return (f"the script ended after {self.steps_seen} training steps, in the {self.stage.value} stage; the "
                f"capture needs {needed}: let the script run longer (e.g. more --steps) or lower --warmup")

    def step(self) -> bool:
        """Mark the end of a training step; True once the trace is written."""
        if self.stage is Stage.DONE:
            return True
        self.steps_seen += 1
        ended = self.probe.mark_step()
        if self.steps_seen == 1 and not self.config.cpu_test_mode and not torch.cuda.is_initialized():
            raise CaptureError(NO_CUDA)
        {Stage.WARMUP: self._warmup_step, Stage.WINDOW: self._window_step,
         Stage.PROFILER_WARMUP: self._profiler_warmup_step, Stage.PROFILE: self._profile_step,
         Stage.SHAPES: self._shapes_step}[self.stage](ended)
        return self.stage is Stage.DONE

    def _warmup_step(self, ended: int) -> None:
        if self.steps_seen < self.config.warmup:
            return
        _synchronize()
        if self._sampler is not None:
            self._sampler.start()
        cuda = torch.cuda.is_initialized() and not self.config.cpu_test_mode
        self._clock = shape_rounds.StepClock(self._now_s, cuda)
        self._clock.mark()
        self._mark_s, self._counted, self.stage = self._now_s(), 0, Stage.WINDOW

    def _profiles_shapes(self) -> bool:
        """Whether the capture profiles several shapes (``shapes`` > 1, outside torchrun)."""
        return (self.config.shapes is None or self.config.shapes > 1) and not self.rank.distributed

    def _window_step(self, ended: int) -> None:
        self._counted += 1
        self._clock.mark()
        self._window_steps.append(ended)
        shapes = {self.probe.shape_of(step) for step in self._window_steps} - {None}
        varying = len(shapes) > 1 and self._profiles_shapes()
        least = shape_rounds.MIN_VARYING_WINDOW_STEPS if varying else MIN_WINDOW_STEPS
        done = self._now_s() - self._mark_s >= self.config.energy_window_s and self._counted >= least
        if self._job is not None:
            agreeing_s = self._now_s()
            done = self._job.min([float(done)])[0] > 0
            self._mark_s += self._now_s() - agreeing_s  # the ranks' agreement is no part of the training step
        if not done:
            return
        _synchronize()
        elapsed_s = self._now_s() - self._mark_s
        reading = self._sampler.stop() if self._sampler is not None else None
        self._power = self._reader.power_limits() if self._reader is not None else None
        self._window = (elapsed_s, self._counted, reading)
        step_s = elapsed_s / self._counted
        self._job_step_s = step_s if self._job is None else self._job.max([step_s])[0]
        steps = self._window_steps
        self._shapes = shape_rounds.WindowShapes(tuple(self.probe.shape_of(step) for step in steps),
                                                 tuple(self._clock.durations_s()),
                                                 tuple(bool(self.probe.first_seen(step)) for step in steps))
        if self._shapes.varies and self._profiles_shapes():
            self._start_rounds()
            return
        activities = [ProfilerActivity.CPU] + ([] if self.config.cpu_test_mode else [ProfilerActivity.CUDA])
        self._profiler = profile(activities=activities, record_shapes=True,
                                 schedule=schedule(wait=0, warmup=1, active=self.config.steps, repeat=1),
                                 on_trace_ready=lambda p: p.export_chrome_trace(str(self._folder / "profile.json")))
        self._profiler.start()
        self.stage = Stage.PROFILER_WARMUP

    def _start_rounds(self) -> None:
        counts = self._shapes.counts
        targets = shape_rounds.choose_targets(counts, self.config.shapes_for(shape_rounds.window_axes(counts)))
        self._rounds = shape_rounds.ShapeRounds(targets, self.probe, self._folder, self.config.max_profiled_steps,
                                           self._now_s, self.config.cpu_test_mode)
        self._rounds.start()
        self.stage = Stage.SHAPES

    def _shapes_step(self, ended: int) -> None:
        rounds = self._rounds
        assert rounds is not None
        if not rounds.step(ended):
            return
        if not rounds.captured:
            raise CaptureError(f"none of the run's {len(rounds.targets)} most frequent and extreme step shapes came "
                               f"up in {rounds.profiled_steps} profiled steps; raise --max-profiled-steps")
        window_s, window_steps, reading = self._window
        timing = StepTiming(window_s, window_steps, rounds.profiled_s, rounds.profiled_steps, reading,
                            self._job_step_s, self.rank, self._power)
        self.report = write_shape_set(rounds, self._shapes, self.config, timing,
                                      self._reader.name if self._reader else "")
        self.stage = Stage.DONE

    def _profiler_warmup_step(self, ended: int) -> None:
        _synchronize()
        assert self._profiler is not None
        self._profiler.step()
        self._mark_s, self._counted, self.stage = self._now_s(), 0, Stage.PROFILE

    def _profile_step(self, ended: int) -> None:
        assert self._profiler is not None
        self._counted += 1
        if self._counted < self.config.steps:
            self._profiler.step()
            return
        _synchronize()
        profiled_s = self._now_s() - self._mark_s
        self._profiler.step()
        self._profiler.stop()
        self._profiler = None
        window_s, window_steps, reading = self._window
        timing = StepTiming(window_s, window_steps, profiled_s, self.config.steps, reading, self._job_step_s,
                            self.rank, self._power)
        recording = self._folder / "profile.json"
        trace = build_trace(read_gpu_recording(recording, self.config), self.config, timing,
                            self._reader.name if self._reader else "", self._job)
        trace = shape_rounds.with_shapes(trace, self.probe.shape_of(ended), self._shapes)
        report = write_capture(trace, recording, self.config, timing)
        known = [trace] if trace.meta.step_shape else []
        shapes = shape_rounds.shapes_report(self._shapes, known, [report.output] * len(known), [], self.config.steps)
        self.report = dataclasses.replace(report, shapes=shapes)
        self.stage = Stage.DONE
