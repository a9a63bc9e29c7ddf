"""``kdvfs capture --ncu``: Nsight Compute counters for the captured step's kernels.

A second run of the script under ``ncu --clock-control none`` (clocks left to the GPU, as in the capture)
profiles only the kernels launched inside an NVTX start/end range that :class:`StepMarker` puts around the
first step after the warm-up (a process-wide range: a push/pop range would miss the backward kernels,
which the autograd engine launches from its own thread); the script is stopped after it. The counters
(SM, DRAM and tensor-pipe throughput, SM clock) are matched to the trace's kernels by
:func:`kdvfs.envs.trace.ncu.enrich_with_ncu`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from kdvfs.common.files import read_text
from kdvfs.envs.trace.ncu import CLOCK_COLUMN, DRAM_COLUMNS, SM_COLUMN, TENSOR_COLUMNS, enrich_with_ncu, parse_ncu_csv
from kdvfs.envs.trace.trace import Trace
from kdvfs.runtime.capture.capture_errors import CaptureError

NVTX_RANGE = "kdvfs_step"
NCU_METRICS = (SM_COLUMN, DRAM_COLUMNS[0], TENSOR_COLUMNS[0], CLOCK_COLUMN)


def _nvtx_start(name: str) -> int:
    import torch

    return int(torch.cuda.nvtx.range_start(name))


def _nvtx_end(handle: int) -> None:
    import torch

    torch.cuda.synchronize()
    torch.cuda.nvtx.range_end(handle)


class StepMarker:
    """Puts the NVTX range ``kdvfs_step`` around the training step that follows ``warmup`` steps."""

    def __init__(self, warmup: int, start: Callable[[str], int] = _nvtx_start,
                 end: Callable[[int], None] = _nvtx_end) -> None:
        self.warmup = warmup
        self.steps_seen = 0
        self._start, self._end = start, end
        self._handle = 0

    def step(self) -> bool:
        """Mark the end of a training step; True once the marked step ended."""
        self.steps_seen += 1
        if self.steps_seen == self.warmup:
            self._handle = self._start(NVTX_RANGE)
        elif self.steps_seen == self.warmup + 1:
            self._end(self._handle)
            return True
        return False


def find_ncu() -> str:
    """Path of the ``ncu`` executable."""
    path = shutil.which("ncu")
    if path is None:
        raise CaptureError("--ncu: Nsight Compute's `ncu` is not on the PATH; install Nsight Compute (or add its "
                           "folder to PATH), or capture without --ncu")
    return path


def ncu_argv(ncu: str, log: Path, child: Sequence[str]) -> list[str]:
    """The ncu command that profiles the marked step of ``child`` (the capture's child process command)."""
    return [ncu, "--clock-control", "none", "--target-processes", "all", "--nvtx", "--nvtx-include",
            NVTX_RANGE, "--metrics", ",".join(NCU_METRICS), "--csv", "--page", "raw", "--log-file", str(log),
            *child]


def enrich(trace: Trace, log: Path) -> tuple[Trace, int]:
    """The trace with the counters of an ncu log attached; the number of kernels matched."""
    if not log.is_file():
        raise CaptureError("--ncu: ncu wrote no report; run the ncu command by hand to see why")
    counters = parse_ncu_csv(read_text(log), f"ncu log {log.name}")
    enriched, matched = enrich_with_ncu(trace, counters, "kdvfs capture --ncu")
    if matched == 0:
        raise CaptureError("--ncu: no ncu kernel matched the captured step's kernels; the ncu run profiled a "
                           "different sequence (check that the script's steps repeat)")
    return replace(enriched, meta=replace(enriched.meta, source=f"{trace.meta.source} +ncu")), matched
