"""The capture's Python API in this process: stages, measurements, the recorded CPU step's detection, phases
and classification (CPU test mode), and what happens when the loop ends early or runs on the CPU."""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

import pynvml
import pytest
import torch

from examples import gpt
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.importing import read_recording, split_steps
from kdvfs.envs.trace.trace import Category, Kind, Phase
from kdvfs.runtime.capture.capture_errors import CaptureError
from kdvfs.runtime.capture.cpu_emulation import emulate_gpu_recording
from kdvfs.runtime.capture.session import Capture, Stage
from kdvfs.runtime.device.errors import DeviceError
from kdvfs.runtime.testing.fake_nvml import READ_ONLY_CALL, EnergyFakeNvml, h200_from_probe

ORDER = [Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER, Phase.OTHER]


def tiny_training() -> tuple[gpt.GPT, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = gpt.GPT(gpt.SIZES["tiny"])
    tokens, targets = torch.randint(256, (2, 2, 32))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True), tokens, targets


def train(capture: Capture, steps: int) -> int:
    model, optimizer, tokens, targets = tiny_training()
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(tokens, targets).backward()
        optimizer.step()
        if capture.step():
            return step + 1
    return steps


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Capture, EnergyFakeNvml, Path]:
    folder = tmp_path_factory.mktemp("capture")
    fake = EnergyFakeNvml([h200_from_probe()], power_w=250.0)
    with Capture(folder / "tiny.trace.json.gz", fake, steps=2, warmup=2, energy_window_s=0.3, cpu_test_mode=True,
                 workload="gpt-tiny", command="python examples/gpt.py", keep_profile=str(folder / "raw.json.gz")
                 ) as capture:
        assert train(capture, 200) == capture.steps_seen
    return capture, fake, folder


def test_stages_and_report(captured: tuple[Capture, EnergyFakeNvml, Path]) -> None:
    capture, fake, _ = captured
    report = capture.report
    assert capture.stage is Stage.DONE and report is not None
    window = report.window_steps
    assert capture.steps_seen == 2 + window + 1 + 2 and window >= 3 and report.window_s >= 0.3
    assert report.avg_power_w == pytest.approx(250.0, rel=0.02)
    assert report.energy_j_per_step == pytest.approx(250.0 * report.step_time_s, rel=0.02)
    assert report.overhead == pytest.approx(report.profiled_step_time_s / report.step_time_s - 1)
    assert (report.observed_core_mhz, report.mem_mhz) == (1980.0, 3201.0)
    assert all(READ_ONLY_CALL.fullmatch(name) for name in fake.state.calls), set(fake.state.calls)
    assert not fake.state.initialised


def test_trace_meta_and_measurements(captured: tuple[Capture, EnergyFakeNvml, Path]) -> None:
    capture, _, folder = captured
    trace = load_trace(folder / "tiny.trace.json.gz")
    meta, report = trace.meta, capture.report
    assert report is not None and meta.workload == "gpt-tiny" and meta.gpu.startswith("CPU (kdvfs capture")
    assert meta.source == "kdvfs capture --steps 2 --warmup 2: python examples/gpt.py"
    assert meta.measurements["energy_j_per_step"] == pytest.approx(report.energy_j_per_step)
    assert meta.measurements["step_time_s"] == pytest.approx(report.step_time_s)
    assert (meta.observed_core_mhz, meta.ref_mem_mhz, meta.ref_core_mhz) == (1980.0, 3201.0, None)
    assert (meta.power_limit_w, meta.power_limit_range_w, report.power_limit_w) == (700.0, (200.0, 700.0), 700.0)
    assert len(trace) == report.activities == trace.count(Kind.KERNEL)


def test_phases_and_categories_of_the_recorded_step(captured: tuple[Capture, EnergyFakeNvml, Path]) -> None:
    trace = load_trace(captured[2] / "tiny.trace.json.gz")
    ranks = [ORDER.index(k.phase) for k in trace.kernels]
    assert ranks == sorted(ranks)
    phases = collections.Counter(k.phase for k in trace.kernels)
    assert phases[Phase.FORWARD] > 10 and phases[Phase.BACKWARD] > phases[Phase.FORWARD] and phases[Phase.OPTIMIZER]
    by_phase = {phase: {k.category for k in trace.kernels if k.phase is phase} for phase in phases}
    assert {Category.GEMM, Category.ATTENTION, Category.NORM, Category.EMBEDDING} <= by_phase[Phase.FORWARD]
    assert Category.SOFTMAX_LOSS in by_phase[Phase.FORWARD] and Category.GEMM in by_phase[Phase.BACKWARD]
    assert by_phase[Phase.OPTIMIZER] == {Category.OPTIMIZER}
    gemm = next(k for k in trace.kernels if k.op is not None and k.op.name == "aten::addmm")
    assert gemm.op is not None and (64, 64) in gemm.op.input_dims


def test_steps_of_the_recording_repeat(captured: tuple[Capture, EnergyFakeNvml, Path]) -> None:
    folder = captured[2]
    emulated = folder / "emulated.json"
    assert emulate_gpu_recording(folder / "raw.json.gz", emulated) > 0
    recording = read_recording(emulated)
    steps = split_steps(recording)
    assert len(steps) == 2
    names = [[recording.activities[i].name for i in step] for step in steps]
    assert names[0] == names[1] and len(names[0]) == len(load_trace(folder / "tiny.trace.json.gz"))
    document = json.loads(gzip.decompress((folder / "raw.json.gz").read_bytes()))
    assert not [e for e in document["traceEvents"] if e.get("cat") == "kernel"]


def test_loop_that_ends_early_writes_nothing(tmp_path: Path) -> None:
    output = tmp_path / "t.json"
    with pytest.raises(CaptureError, match="ended after 4 training steps, in the window stage"), \
            Capture(output, measure_energy=False, warmup=2, energy_window_s=30.0, cpu_test_mode=True) as capture:
        train(capture, 4)
    assert not output.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize(("failure", "fix"), [
    ({"nvmlInit": pynvml.NVML_ERROR_DRIVER_NOT_LOADED}, "load the NVIDIA driver"),
    ({"nvmlDeviceGetTotalEnergyConsumption": pynvml.NVML_ERROR_NO_PERMISSION}, "CAP_SYS_ADMIN"),
    ({"nvmlDeviceGetTotalEnergyConsumption": pynvml.NVML_ERROR_NOT_SUPPORTED}, "does not offer it"),
])
def test_nvml_failures_before_the_script_runs(tmp_path: Path, failure: dict[str, int], fix: str) -> None:
    fake = EnergyFakeNvml([h200_from_probe()])
    fake.state.failures.update(failure)
    with pytest.raises(DeviceError, match=fix), Capture(tmp_path / "t.json", fake, cpu_test_mode=True):
        pass
    assert not fake.state.initialised and not list(tmp_path.iterdir())


def test_loop_without_steps_names_the_optimizer(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="without reaching a step boundary"), \
            Capture(tmp_path / "t.json", measure_energy=False, cpu_test_mode=True):
        pass


def test_cpu_only_loop_fails_at_the_first_step(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(CaptureError, match="no CUDA kernels recorded: the script ran on the CPU"), \
            Capture(tmp_path / "t.json", measure_energy=False) as capture:
        train(capture, 3)
    assert not list(tmp_path.iterdir())
