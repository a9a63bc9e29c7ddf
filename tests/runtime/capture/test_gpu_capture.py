"""On a real NVIDIA GPU (``pytest -m gpu``): capture the tiny example with the real profiler and NVML, and
measure one microbenchmark's power. Read-only: nothing here changes a clock or a power limit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.trace import Phase
from kdvfs.runtime.cli import main

pytestmark = pytest.mark.gpu


def test_capture_on_the_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "tiny.trace.json"
    code = main(["capture", "--steps", "2", "--warmup", "3", "--energy-window-s", "2", "-o", str(output), "--json",
                 "--", sys.executable, str(REPO_ROOT / "examples" / "gpt.py"), "--size", "tiny", "--device", "cuda",
                 "--steps", "100000"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report, trace = json.loads(captured.out), load_trace(output)
    assert "NVIDIA" in trace.meta.gpu and report["kernels"] > 20 and report["energy_j_per_step"] > 0
    assert {k.phase for k in trace.kernels} >= {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER}
    assert trace.meta.observed_core_mhz and trace.meta.ref_mem_mhz


def test_microbenchmark_power_on_the_gpu() -> None:
    import torch

    from kdvfs.runtime.device.nvml_device import GpuReader
    from kdvfs.runtime.microbench.measure import measure_benchmark
    from kdvfs.runtime.microbench.microbench import MICROBENCHMARKS

    bench = next(b for b in MICROBENCHMARKS if b.name == "add_fp32")
    with GpuReader(0) as reader:
        row = measure_benchmark(bench, torch.device("cuda:0"), reader, duration_s=1.0)
    assert row.power_w > 20 and 0 < row.time_s < 0.01 and row.core_mhz > 0
