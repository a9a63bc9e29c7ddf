"""Never leave a GPU at locked clocks: signals, the watchdog of a killed process, ``kdvfs reset``; clear errors
that change nothing; ``kdvfs run`` end to end; the frozen-policy source; the training-loop integrations."""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pynvml
import pytest

from kdvfs.agents.learned.policy.frozen import FrozenPolicy, PolicyFileError
from kdvfs.common.errors import UnknownGpuError
from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.env.observing.observation import ObservationSpec
from kdvfs.envs.env.steps.clock_grid import ClockGrid
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.runtime.cli import main
from kdvfs.runtime.controller import controller, hf_callback, lightning_callback
from kdvfs.runtime.controller.control import issuer
from kdvfs.runtime.controller.decisions import actuator, sources
from kdvfs.runtime.controller.measurement import accounting
from kdvfs.runtime.controller.model import plan, step_plan
from kdvfs.runtime.controller.model.plan import ScheduleSourceError
from kdvfs.runtime.controller.timing import anchor_hooks, anchors, gpu_timeline
from kdvfs.runtime.controller.training import boot, integrations, launch
from kdvfs.runtime.device import nvml_device as device_nvml
from kdvfs.runtime.device import watchdog
from kdvfs.runtime.device.errors import NvmlPermissionError, NvmlUnavailableError, UnsupportedClockError
from kdvfs.runtime.testing import fake_gpu
from kdvfs.runtime.testing.fake_nvml import READ_ONLY_CALL, EnergyFakeNvml
from tests.runtime.controller_helpers import TRACE, fake_controller, run_steps, write_plan
from tests.schema_check import strict_loads, validate

RESETS = ["nvmlDeviceResetGpuLockedClocks", "nvmlDeviceResetMemoryLockedClocks"]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_plan(tmp_path_factory.mktemp("plan") / "plan.json")


@pytest.mark.parametrize("signum, raised", [(signal.SIGTERM, SystemExit), (signal.SIGINT, KeyboardInterrupt)])
def test_clocks_restored_on_a_signal(plan_file: Path, signum: int, raised: type[BaseException]) -> None:
    # The interpreter's own SIGINT handler, installed anew: in two full-suite runs SIGINT raised nothing here
    # although signal.getsignal named it (cause not found; a C library replacing the handler is one that
    # getsignal would not show).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    control, gpu, _ = fake_controller(plan_file)
    try:
        with pytest.raises(raised), control:
            run_steps(control, 10)
            assert gpu.set_calls
            signal.raise_signal(signum)  # in this (the main) thread: its handler runs at once
    finally:
        signal.signal(signal.SIGINT, previous)
    assert gpu.calls[-1].name == "reset_clocks"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize("signum, raised", [(signal.SIGTERM, SystemExit), (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_during_the_shutdown_leaves_no_clock_locked(plan_file: Path, monkeypatch: pytest.MonkeyPatch,
                                                             signum: int, raised: type[BaseException]) -> None:
    """torchrun's SIGTERM to a rank that is closing its controller after a collective failed: it waits for the
    shutdown's end. A Ctrl-C cuts the thread's stop short, yet no request of the thread's follows the restore."""
    stop_thread = issuer.Issuer.join

    def interrupted(thread: issuer.Issuer, timeout: float | None = None) -> None:
        signal.raise_signal(signum)  # the main thread's handler runs at once
        stop_thread(thread, timeout)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    control, gpu, _ = fake_controller(plan_file)
    try:
        with pytest.raises(raised) as ended, control:
            run_steps(control, 10)
            assert gpu.set_calls
            monkeypatch.setattr(issuer.Issuer, "join", interrupted)
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.undo()
    for thread in threading.enumerate():
        if isinstance(thread, issuer.Issuer):
            thread.join(10)
    assert gpu.calls[-1].name == "reset_clocks"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    if signum == signal.SIGTERM:  # held to the end: the shutdown ran whole
        assert ended.value.code == 128 + signal.SIGTERM and control.summary is not None
        assert control.summary.gpu_restored

def _parent_with_watchdog(log: Path, stop: bool) -> subprocess.Popen[str]:
    script = ("import time\n"
              "from kdvfs.runtime.device.watchdog import spawn_watchdog, stop_watchdog\n"
              "process = spawn_watchdog(0, 'kdvfs.runtime.testing.nvml')\n"
              "time.sleep(3)\nprint('ready', flush=True)\n"
              + ("stop_watchdog(process, True)\nprint('stopped', flush=True)\n" if stop else "time.sleep(60)\n"))
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "KDVFS_FAKE_NVML_LOG": str(log)})


def _wait_for_calls(path: Path, last: list[str], timeout_s: float = 30.0) -> list[str]:
    """The NVML calls logged at ``path`` once they end with ``last`` (or whatever is there after ``timeout_s``):
    the watchdog writes its resets and its shutdown one by one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        calls = path.read_text().split() if path.is_file() else []
        if calls[-len(last):] == last:
            return calls
        time.sleep(0.1)
    return path.read_text().split() if path.is_file() else []


def test_watchdog_resets_the_clocks_when_the_training_process_is_killed(tmp_path: Path) -> None:
    log = tmp_path / "nvml.log"
    parent = _parent_with_watchdog(log, stop=False)
    assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
    parent.kill()
    parent.wait()
    calls = _wait_for_calls(log, [*RESETS, "nvmlShutdown"])
    assert calls[-3:] == [*RESETS, "nvmlShutdown"] and "nvmlInit" in calls


def test_watchdog_leaves_the_gpu_alone_after_a_clean_stop(tmp_path: Path) -> None:
    log = tmp_path / "nvml.log"
    parent = _parent_with_watchdog(log, stop=True)
    out, _ = parent.communicate(timeout=60)
    assert out.split() == ["ready", "stopped"]
    assert not log.is_file() or not set(log.read_text().split()) & set(RESETS)


def test_a_plan_for_another_gpu_is_refused_before_any_clock_change(tmp_path: Path, plan_file: Path) -> None:
    other = tmp_path / "h100.json"
    other.write_text(json.dumps({**json.loads(plan_file.read_text()), "gpu": "h100-sxm"}))
    control, gpu, _ = fake_controller(other)
    with pytest.raises(ScheduleSourceError, match=r"is for GPU profile 'h100-sxm'.*the GPU is an NVIDIA H200"):
        control.__enter__()
    assert gpu.calls == []


def test_an_unsupported_clock_is_refused_before_any_clock_change(plan_file: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    control, gpu, _ = fake_controller(plan_file)
    monkeypatch.setattr(gpu, "supported_clocks_mhz", lambda: {3201: (1980,), 2201: (1980,)})
    with pytest.raises(UnsupportedClockError, match="does not support an SM clock of"):
        control.__enter__()
    assert gpu.set_calls == []


def test_missing_permission_is_refused_before_any_clock_change(plan_file: Path) -> None:
    control, gpu, _ = fake_controller(plan_file, permission=False)
    with pytest.raises(NvmlPermissionError, match=r"needs root or CAP_SYS_ADMIN.*--dry-run"):
        control.__enter__()
    assert gpu.set_calls == []
    control, gpu, _ = fake_controller(plan_file, permission=False, dry_run=True)
    with control:
        run_steps(control, 8)
    assert gpu.set_calls == []


def test_missing_nvml_is_a_clear_error(plan_file: Path, shared_nvml: EnergyFakeNvml) -> None:
    from kdvfs.runtime.controller import Controller

    with pytest.raises(NvmlUnavailableError, match="install nvidia-ml-py"):
        Controller(str(plan_file), TRACE, nvml_module="no_such_nvml_binding").__enter__()
    shared_nvml.state.failures["nvmlInit"] = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(NvmlUnavailableError, match="install the NVIDIA driver"):
        Controller(str(plan_file), TRACE, nvml_module="kdvfs.runtime.testing.nvml").__enter__()
    assert all(READ_ONLY_CALL.fullmatch(c) for c in shared_nvml.state.calls)


def test_plan_files_that_do_not_fit_the_trace(tmp_path: Path, plan_file: Path) -> None:
    document = json.loads(plan_file.read_text())
    (tmp_path / "short.json").write_text(json.dumps({**document, "kernels": 3}))
    (tmp_path / "foreign.json").write_text(json.dumps({"format": "something"}))
    (tmp_path / "damaged.json").write_text(json.dumps({**document, "segments": [{"clocks": "1950:2201"}]}))
    (tmp_path / "text.json").write_text(json.dumps({**document, "segments": "0:1950:2201"}))
    for name, message in (("short.json", "covers 3 kernels"), ("foreign.json", "not a kdvfs-schedule"),
                          ("missing.json", "no such plan or policy file"),
                          ("damaged.json", "damaged.json: damaged segments"), ("text.json", "text.json: damaged")):
        control, _, _ = fake_controller(tmp_path / name)
        with pytest.raises(ScheduleSourceError, match=message):
            control.__enter__()


def _random_policy(path: Path, gpu: str) -> Path:
    """A frozen policy with random weights (the issue-5 file format), trained for ``gpu``."""
    env = {"core_fractions": [0.6, 0.8], "every_core_clock": False, "memory_mhz": [3201, 2201], "next_kernels": 4,
           "window_latencies": [1.0], "plan_budgets": [0.01, 0.3], "decision_latencies": 0.25}
    grid = ClockGrid.for_profile(load_profile("h200"), env["core_fractions"], env["memory_mhz"])
    spec = ObservationSpec(grid, 4, (1.0,), (0.01, 0.3))
    nvec = (2, spec.plan_choices)  # request, then plan 1% or 30%, the fitting plan or the budget's plan
    rng = np.random.default_rng(0)
    weights = (rng.normal(0, 0.3, (spec.size, 16)).astype(np.float32),
               rng.normal(0, 0.3, (16, sum(nvec))).astype(np.float32))
    last = np.zeros(sum(nvec), np.float32)
    last[[1, 3]] = 5.0  # requests, mostly the 30% plan (locked clocks)
    FrozenPolicy(gpu=gpu, spec_hash=spec.hash(), env=env, nvec=nvec, activation="tanh", weights=weights,
                 biases=(np.zeros(16, np.float32), last),
                 obs_mean=np.zeros(spec.size, np.float32), obs_var=np.ones(spec.size, np.float32), obs_clip=10.0,
                 obs_epsilon=1e-8, meta={}).save(path)
    return path


def test_a_frozen_policy_drives_the_controller(tmp_path: Path) -> None:
    policy = _random_policy(tmp_path / "h200.kdvfs-policy.npz", "h200")
    control, gpu, _ = fake_controller(policy)
    with control:
        run_steps(control, 12)
    assert control.plan is not None and control.plan.source == "policy h200.kdvfs-policy.npz (online)"
    assert control.plan.schedule.reactive and gpu.calls[-1].name == "reset_clocks"
    assert control.summary is not None and control.summary.online_decisions > 0
    other = _random_policy(tmp_path / "a100.kdvfs-policy.npz", "a100-sxm4")
    control, gpu, _ = fake_controller(other)
    with pytest.raises(PolicyFileError, match="trained for GPU 'a100-sxm4', not 'h200'"):
        control.__enter__()
    assert gpu.calls == []


def test_a_gpu_no_profile_lists_is_refused_before_any_clock_change(tmp_path: Path, plan_file: Path) -> None:
    policy = _random_policy(tmp_path / "h200.kdvfs-policy.npz", "h200")
    control, gpu, _ = fake_controller(policy)
    gpu.name = "NVIDIA H200 NVL"
    with pytest.raises(UnknownGpuError, match=r"'NVIDIA H200 NVL'.*`kdvfs gpus local --write PATH`"):
        control.__enter__()
    assert gpu.calls == []
    control, gpu, _ = fake_controller(plan_file)
    gpu.name = "NVIDIA H200 NVL"
    with pytest.raises(ScheduleSourceError, match=r"is for GPU profile 'h200'.*the GPU is an NVIDIA H200 NVL"):
        control.__enter__()
    assert gpu.calls == []


def test_kdvfs_reset_resets_both_clocks(shared_nvml: EnergyFakeNvml, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(device_nvml, "has_clock_permission", lambda *args: False)
    assert main(["reset", "--nvml-module", "kdvfs.runtime.testing.nvml"]) == 2
    assert "root or CAP_SYS_ADMIN" in capsys.readouterr().err and not set(shared_nvml.state.calls) & set(RESETS)
    monkeypatch.setattr(device_nvml, "has_clock_permission", lambda *args: True)
    shared_nvml.state.calls.clear()
    assert main(["reset", "--gpu-index", "0", "--nvml-module", "kdvfs.runtime.testing.nvml"]) == 0
    assert [c for c in shared_nvml.state.calls if c in RESETS] == RESETS and not shared_nvml.state.initialised
    assert "returned to the GPU's own control" in capsys.readouterr().out


# Slow: test_run_end_to_end.py::test_a_cpu_test_mode_run_matches_its_own_capture is the fast suite's dry run of
# `kdvfs run` end to end (summary, source, read-only NVML calls, the log's start), on a captured trace; the
# controller opens a bundled trace name in this file's in-process tests (controller_helpers.TRACE).
@pytest.mark.slow
def test_kdvfs_run_dry_run_end_to_end(tmp_path: Path, plan_file: Path) -> None:
    log, calls = tmp_path / "run.jsonl", tmp_path / "nvml.log"
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from kdvfs.runtime.cli import main; sys.exit(main(sys.argv[1:]))", "run",
         "--policy", str(plan_file), "--trace", TRACE, "--dry-run", "--cpu-test-mode", "--nvml-module",
         "kdvfs.runtime.testing.nvml", "--log", str(log), "--json", "--", sys.executable,
         str(REPO_ROOT / "examples" / "gpt.py"), "--size", "tiny", "--device", "cpu", "--steps", "12"],
        capture_output=True, text=True, cwd=REPO_ROOT, env={**os.environ, "KDVFS_FAKE_NVML_LOG": str(calls)},
        check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = strict_loads(done.stdout)
    validate(summary, "run-summary")
    assert summary["dry_run"] and summary["steps"] == 12 and summary["source"] == "plan plan.json (latency-optimal)"
    assert all(READ_ONLY_CALL.fullmatch(name) for name in calls.read_text().split())
    assert json.loads(log.read_text().splitlines()[0])["event"] == "start"


def test_kdvfs_run_refuses_a_bad_plan_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--policy", str(tmp_path / "none.json"), "--trace", TRACE, "--dry-run", "--cpu-test-mode",
                 "--nvml-module", "kdvfs.runtime.testing.nvml", "--", sys.executable,
                 str(REPO_ROOT / "examples" / "gpt.py"), "--size", "tiny", "--device", "cpu", "--steps", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "no such plan or policy file" in err


def test_training_loop_integrations_drive_the_controller(plan_file: Path) -> None:
    control, gpu, _ = fake_controller(plan_file)
    callback = hf_callback(control, base=object)
    callback.on_train_begin(None, None, None)
    for _ in range(10):
        callback.on_step_end(None, None, None)
        control.flush()
    callback.on_train_end(None, None, None)
    assert control.summary is not None and control.summary.steps == 10 and gpu.calls[-1].name == "reset_clocks"
    control, gpu, _ = fake_controller(plan_file)
    callback = lightning_callback(control, base=object)
    trainer = types.SimpleNamespace(accumulate_grad_batches=2)
    callback.on_train_start(trainer, None)
    for batch in range(20):
        callback.on_train_batch_end(trainer, None, None, None, batch)
        control.flush()
    callback.on_exception(trainer, None, RuntimeError("stop"))
    assert control.summary is not None and control.summary.steps == 10 and gpu.calls[-1].name == "reset_clocks"


def test_the_real_callback_bases_when_installed(plan_file: Path) -> None:
    transformers = pytest.importorskip("transformers")
    control, _, _ = fake_controller(plan_file)
    assert isinstance(hf_callback(control), transformers.TrainerCallback)


@pytest.mark.parametrize("module", [accounting, actuator, anchors, anchor_hooks, boot, controller,
                                    gpu_timeline, integrations, issuer, launch, plan, sources, step_plan, watchdog,
                                    fake_gpu])
def test_only_nvml_device_names_nvml_setters(module: types.ModuleType) -> None:
    tree = ast.parse(inspect.getsource(module))
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and re.match(r"nvml[A-Z]", n.attr)}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert all(READ_ONLY_CALL.fullmatch(name) for name in names)
    assert not {s for s in strings if s.startswith("nvmlDevice") and ("Set" in s or "Reset" in s)}
