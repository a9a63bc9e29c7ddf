"""``kdvfs run`` however the training ends (issue 40): ``--json`` prints one summary also when the trainer
aborts (``os.abort()``) and no process wrote one, with ``error``, ``gpu_restored`` and what the log measured;
on the fake NVML whose lock state a file shares across processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pynvml

from kdvfs.common.paths import REPO_ROOT
from kdvfs.runtime.cli.live.run import summary_table
from kdvfs.runtime.controller.model.run_summary import JobSummary
from tests.runtime.controller.training.test_run_end_to_end import (
    GPT,
    _environment,
    _locks,
    _log_text,
    _run_argv,
    _trainer_pid,
    _wait,
)
from tests.schema_check import strict_loads, validate

ABORT_AT_STEP = 1500


def _aborting_trainer(tmp_path: Path) -> list[str]:
    """The tiny GPT, aborted (SIGABRT, no atexit, no finally) at its ``ABORT_AT_STEP``-th optimizer step."""
    script = tmp_path / "abort.py"
    script.write_text(
        "import os, runpy, sys\n"
        "from torch.optim.optimizer import register_optimizer_step_post_hook\n"
        "steps = [0]\n"
        "def hook(optimizer, args, kwargs):\n"
        "    steps[0] += 1\n"
        f"    if steps[0] == {ABORT_AT_STEP}:\n"
        "        os.abort()\n"
        "register_optimizer_step_post_hook(hook)\n"
        "sys.argv = sys.argv[1:]\n"
        "sys.path.insert(0, os.path.dirname(sys.argv[0]))\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    return [sys.executable, str(script), *GPT[1:]]


def test_json_summary_after_the_trainer_aborts(captured: tuple[Path, Path], tmp_path: Path) -> None:
    argv = _run_argv(captured, tmp_path, 100_000)
    argv = [*argv[:argv.index("--") + 1], *_aborting_trainer(tmp_path), "--steps", "100000"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, env=_environment(tmp_path),
                          check=False, timeout=120)
    assert done.returncode == 128 + signal.SIGABRT, done.stderr[-2000:]
    summary = strict_loads(done.stdout)
    validate(summary, "run-summary")  # the ended form: what the log measured so far
    assert "SIGABRT" in summary["error"] and summary["gpu_restored"] is True, summary
    assert summary["partial"] and summary["windows"] > 0 and summary["steps"] >= ABORT_AT_STEP // 2, summary
    assert _locks(tmp_path) == {}


def test_json_error_when_the_run_is_refused(tmp_path: Path) -> None:
    from tests.runtime.controller.training.test_run_end_to_end import KDVFS

    done = subprocess.run([*KDVFS, "run", "--policy", str(tmp_path / "none.json"), "--trace", "h200/gpt2s-b16",
                           "--json", "--cpu-test-mode", "--", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    assert done.returncode == 2
    document = strict_loads(done.stdout)
    validate(document, "error")
    assert document["error"] and document["gpu_restored"] is True


def _started_run(captured: tuple[Path, Path], tmp_path: Path) -> subprocess.Popen[str]:
    """``kdvfs run`` of a long training, in its own session (no terminal), once it has locked a clock."""
    process = subprocess.Popen(_run_argv(captured, tmp_path, 100_000), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=REPO_ROOT, env=_environment(tmp_path), start_new_session=True)
    if not _wait(lambda: "core" in _locks(tmp_path) and '"request"' in _log_text(tmp_path)):
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError("the controller never locked a clock")
    return process


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").is_dir() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def test_sigint_to_kdvfs_run_alone_reaches_the_trainer(captured: tuple[Path, Path], tmp_path: Path) -> None:
    process = _started_run(captured, tmp_path)
    try:
        os.kill(process.pid, signal.SIGINT)  # the process alone, not its group: no terminal's Ctrl-C
        stdout, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError(f"kdvfs run did not end after SIGINT: {process.communicate()[1][-3000:]}") from None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    summary = json.loads(stdout)
    assert summary["gpu_restored"] is True and summary["steps"] < 100_000, stderr[-2000:]
    assert _locks(tmp_path) == {}
    leases = list(Path(os.environ["KDVFS_LEASE_DIR"]).glob("*.lease"))
    assert leases and all(path.read_text() == "" for path in leases)  # taken, then released


def test_the_trainer_ends_when_kdvfs_run_is_killed(captured: tuple[Path, Path], tmp_path: Path) -> None:
    process = _started_run(captured, tmp_path)
    trainer = _trainer_pid(process.pid)
    try:
        os.kill(process.pid, signal.SIGKILL)  # kdvfs run alone: its trainer and watchdog are left
        process.wait(30)
        assert _wait(lambda: not _alive(trainer), 30), "the trainer outlived kdvfs run"
        assert _wait(lambda: _locks(tmp_path) == {}, 30), "the clocks stayed locked"
    finally:
        if _alive(trainer):
            os.kill(trainer, signal.SIGKILL)
        process.stdout and process.stdout.close()
        process.stderr and process.stderr.close()


def test_a_refused_clock_setting_mid_run_is_observe_only(captured: tuple[Path, Path], tmp_path: Path) -> None:
    env = _environment(tmp_path, fail_from_call={"nvmlDeviceSetGpuLockedClocks": [1, pynvml.NVML_ERROR_NO_PERMISSION]})
    done = subprocess.run(_run_argv(captured, tmp_path, 150), capture_output=True, text=True, cwd=REPO_ROOT,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = strict_loads(done.stdout)
    validate(summary, "run-summary")
    assert summary["observe_only"] and summary["observe_only"] == summary["error"] and summary["gpu_restored"]
    assert done.stderr.count("kdvfs: observe-only: ") == 1, done.stderr[-2000:]
    assert "observe-only" in summary_table(JobSummary.from_json(summary)).title  # type: ignore[operator]


def test_no_energy_runs_time_only_where_the_energy_counter_fails(captured: tuple[Path, Path],
                                                                 tmp_path: Path) -> None:
    env = _environment(tmp_path, failures={"nvmlDeviceGetTotalEnergyConsumption": pynvml.NVML_ERROR_NOT_SUPPORTED})
    argv = _run_argv(captured, tmp_path, 150)
    refused = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, env=env, check=False)
    assert refused.returncode == 2 and "energy" in refused.stderr, refused.stderr[-2000:]
    at = argv.index("--")
    done = subprocess.run([*argv[:at], "--no-energy", *argv[at:]], capture_output=True, text=True, cwd=REPO_ROOT,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert summary["steps"] == 150 and summary["energy_j_per_step"] is None and summary["gpu_restored"]
    assert summary["measured"]["slowdown_pct"] is not None or summary["measured"]["slowdown_ci95_pct"] is None
