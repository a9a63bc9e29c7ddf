"""A restore that cannot stop half-way, the event log flushed per record, and the Hugging Face callback that
closes the controller when training fails (issue 12), on the fake NVML and the fake GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pynvml
import pytest

from kdvfs.runtime.controller.event_log import EventLog
from kdvfs.runtime.controller.training.integrations import hf_callback
from kdvfs.runtime.device.errors import ClockRestoreError
from kdvfs.runtime.device.nvml_device import NvmlDevice, reset_gpu_clocks
from kdvfs.runtime.testing.fake_nvml import EnergyFakeNvml
from tests.runtime.controller_helpers import fake_controller, run_steps, write_plan

RESETS = ["nvmlDeviceResetGpuLockedClocks", "nvmlDeviceResetMemoryLockedClocks"]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_plan(tmp_path_factory.mktemp("plan") / "plan.json")


def test_a_failed_sm_reset_still_resets_the_memory_clock(shared_nvml: EnergyFakeNvml) -> None:
    with NvmlDevice(0, shared_nvml) as device:
        device.lock_clocks_mhz(1095, 2201)
        shared_nvml.state.failures[RESETS[0]] = pynvml.NVML_ERROR_UNKNOWN
        with pytest.raises(ClockRestoreError) as caught:
            device.reset_clocks()
        assert device.locked
    message = str(caught.value)
    assert "\n" not in message and "GPU 0 (NVIDIA H200)" in message
    assert "`sudo kdvfs reset --gpu-index 0`" in message
    assert [c for c in shared_nvml.state.calls if c in RESETS] == RESETS
    assert shared_nvml.locked == {"core": 1095}


def test_kdvfs_reset_names_the_gpu_when_nvml_cannot_open(shared_nvml: EnergyFakeNvml) -> None:
    shared_nvml.state.failures["nvmlInit"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(ClockRestoreError, match=r"GPU 3 may still be at locked clocks.*--gpu-index 3`"):
        reset_gpu_clocks(3, shared_nvml)


def test_a_failed_restore_is_one_line_and_the_summary_is_still_built(
        plan_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    control, gpu, _ = fake_controller(plan_file, log=str(tmp_path / "run.jsonl"))
    with control:
        run_steps(control, 10)
        assert gpu.set_calls

        def failing_reset() -> None:
            raise ClockRestoreError("GPU 0 (fake) may still be at locked clocks: no; run `sudo kdvfs reset "
                                    "--gpu-index 0`")

        monkeypatch.setattr(gpu, "reset_clocks", failing_reset)
    err = capsys.readouterr().err
    restore_lines = [line for line in err.splitlines() if "locked clocks" in line]
    assert len(restore_lines) == 1 and "sudo kdvfs reset --gpu-index 0" in restore_lines[0]
    assert "Traceback" not in err
    assert control.summary is not None and control.summary.steps == 10
    assert not control.summary.gpu_restored and "locked clocks" in control.summary.restore_error
    events = [json.loads(line)["event"] for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert "restore_error" in events and events[-1] == "summary"


def test_the_event_log_is_on_disk_after_every_record(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "run.jsonl")
    log.write("start", step=0)
    log.write("step", step=1)
    assert [json.loads(line)["event"] for line in (tmp_path / "run.jsonl").read_text().splitlines()] == [
        "start", "step"]
    log.close()


class TrainerCallback:
    """A stand-in for ``transformers.TrainerCallback``: every event a no-op (transformers is not installed)."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...


class Trainer:
    """A stand-in for ``transformers.Trainer.train``'s callback protocol, failing after ``fail_after`` steps."""

    def __init__(self, callbacks: list[Any], fail_after: int, flush: Any) -> None:
        self.callbacks, self.fail_after, self.flush = callbacks, fail_after, flush

    def train(self) -> None:
        for callback in self.callbacks:
            callback.on_train_begin(None, None, None)
        for _ in range(self.fail_after):
            for callback in self.callbacks:
                callback.on_step_end(None, None, None)
            self.flush()
        raise RuntimeError("CUDA out of memory")  # on_train_end is never called, as in transformers


def test_the_hf_callback_closes_the_controller_when_training_fails(plan_file: Path) -> None:
    control, gpu, _ = fake_controller(plan_file)
    with pytest.raises(RuntimeError, match="out of memory"), hf_callback(control, base=TrainerCallback) as callback:
        Trainer([callback], 10, control.flush).train()
    assert gpu.set_calls and gpu.calls[-1].name == "reset_clocks"
    assert control.summary is not None and control.summary.steps == 10
