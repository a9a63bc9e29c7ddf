"""What a capture records and where it writes, shared by ``kdvfs capture``, its child process and the API."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

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
            trace of the last profiled step, whatever its shape; :mod:`kdvfs.runtime.capture.shape_rounds`).
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
    shapes: int = 6
    max_profiled_steps: int = 64

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise CaptureError(f"--steps {self.steps}: record at least one step")
        if self.warmup < 1:
            raise CaptureError(f"--warmup {self.warmup}: warm up for at least one step (the first step allocates "
                               "memory and tunes kernels)")
        if self.shapes < 1 or self.max_profiled_steps < 1:
            raise CaptureError(f"--shapes {self.shapes} and --max-profiled-steps {self.max_profiled_steps}: both "
                               "must be at least 1")
        if not self.energy_window_s > 0:
            raise CaptureError(f"--energy-window-s {self.energy_window_s}: the window must be positive")

    def save(self, path: Path) -> None:
        """Write the config as JSON (for the child process)."""
        Path(path).write_text(json.dumps(dataclasses.asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> CaptureConfig:
        """Read a config written by :meth:`save`."""
        return cls(**json.loads(Path(path).read_text(encoding="utf-8")))
