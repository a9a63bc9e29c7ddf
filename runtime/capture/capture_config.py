"""What a capture records and where it writes, shared by ``kdvfs capture``, its child process and the API."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from kdvfs.envs.model.step.shape_fit import Terms, columns, required_shapes
from kdvfs.envs.trace.shape import ShapeAxes, StepShape
from kdvfs.runtime.capture.capture_errors import CaptureError


@dataclass(frozen=True)
class CaptureConfig:
    """Options of one capture.

    Attributes:
        output: the kdvfs trace to write (``.json`` or ``.json.gz``).
        steps: profiled steps (the trace keeps the last complete one; the others time the profiler).
        warmup: unprofiled steps before anything is measured.
        energy_window_s: minimum length of the unprofiled window that measures step time and energy (s).
        measure_energy: read the NVML energy counter and clocks during that window.
        gpu_index: NVML index of the GPU the script trains on (None: CUDA device ``LOCAL_RANK``, 0 outside
            torchrun, through ``CUDA_VISIBLE_DEVICES``: :func:`kdvfs.runtime.device.visible.rank_gpu_index`).
        nvml_module: the NVML binding to import (``pynvml``; tests name a fake).
        cpu_test_mode: accept a CPU-only script and let its leaf CPU ops stand in for kernels (tests, dry runs).
        workload: label stored in the trace.
        command: the user's command line, stored in the trace's provenance.
        keep_profile: also write the raw profiler recording (chrome trace, gzipped) here.
        report_path: where the child process writes its report (set by ``kdvfs capture``).
        mark_only: mark one step after the warm-up with an NVTX range and record nothing (``--ncu`` runs).
        shapes: most step shapes to profile when the measurement window saw steps of several shapes (1: one
            trace of the last profiled step, whatever its shape; :mod:`kdvfs.runtime.capture.shape_rounds`); None:
            as many as the step model needs for the window's shapes
            (:func:`~kdvfs.envs.model.step.shape_fit.required_shapes`: 6 for one varying length, 9 for two). Between
            1 and that need it is an error (:func:`check_shapes`).
        max_profiled_steps: most steps profiled while looking for those shapes.
    """

    output: str
    steps: int = 2
    warmup: int = 5
    energy_window_s: float = 5.0
    measure_energy: bool = True
    gpu_index: int | None = None
    nvml_module: str = "pynvml"
    cpu_test_mode: bool = False
    workload: str = "capture"
    command: str = ""
    keep_profile: str | None = None
    report_path: str | None = None
    mark_only: bool = False
    shapes: int | None = None
    max_profiled_steps: int = 64

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise CaptureError(f"--steps {self.steps}: record at least one step")
        if self.warmup < 1:
            raise CaptureError(f"--warmup {self.warmup}: warm up for at least one step (the first step allocates "
                               "memory and tunes kernels)")
        if self.max_profiled_steps < 1:
            raise CaptureError(f"--max-profiled-steps {self.max_profiled_steps}: profile at least one step")
        if self.shapes is not None:
            check_shapes(self.shapes, ONE_LENGTH)
        if not self.energy_window_s > 0:
            raise CaptureError(f"--energy-window-s {self.energy_window_s}: the window must be positive")

    def shapes_for(self, axes: ShapeAxes) -> int:
        """How many shapes to profile for steps of ``axes`` (``shapes``, or what the step model needs);
        :class:`CaptureError` where ``shapes`` is too few for them."""
        if self.shapes is None:
            return required_shapes(axes)
        check_shapes(self.shapes, axes)
        return self.shapes

    def save(self, path: Path) -> None:
        """Write the config as JSON (for the child process)."""
        Path(path).write_text(json.dumps(dataclasses.asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> CaptureConfig:
        """Read a config written by :meth:`save`."""
        return cls(**json.loads(Path(path).read_text(encoding="utf-8")))


ONE_LENGTH = ShapeAxes.of([StepShape.of([(1, 1)]), StepShape.of([(1, 2)])])
"""The axes of steps that vary in one length: the fewest shapes any varying run needs."""


def check_shapes(shapes: int, axes: ShapeAxes) -> None:
    """Raise :class:`CaptureError` unless ``shapes`` is 1 (one trace) or at least what the step model needs for
    steps of ``axes`` (:func:`~kdvfs.envs.model.step.shape_fit.required_shapes`), saying what it needs."""
    needed = required_shapes(axes)
    if shapes == 1 or shapes >= needed:
        return
    lengths = len(axes.variables)
    raise CaptureError(f"--shapes {shapes}: steps that vary in {lengths} length{'s' if lengths > 1 else ''} need "
                       f"at least {needed} shapes (the step model's {columns(axes, Terms.QUADRATIC)} columns + "
                       f"{needed - columns(axes, Terms.QUADRATIC)}, so that it is checked with one left out); pass "
                       f"--shapes {needed} or more, 1 for one trace, or leave it out")
