"""``kdvfs run`` through the daemon end to end (issue 44): an unprivileged user's run has its clocks set and
restored by the daemon (and the same run without it is refused), a second run on the leased GPU is refused
naming the first, and a SIGKILLed trainer's GPU is reset when its connection drops, without a watchdog."""

from __future__ import annotations

import grp
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kdvfs.common.paths import REPO_ROOT
from tests.runtime.conftest import TINY_GPT
from tests.runtime.daemon.daemon_helpers import (
    KDVFS,
    NVML,
    RunningDaemon,
    fake_environment,
    locks,
    start_daemon,
    wait_for,
)
from tests.schema_check import strict_loads, validate

NOBODY = 65534


def _run_argv(captured: tuple[Path, Path], folder: Path, steps: int, daemon: RunningDaemon | None,
              in_process: bool = False) -> list[str]:
    """``kdvfs run --json`` of the plan on fake GPU 0, with copies of the trace and plan in ``folder`` (the
    controller in a process of its own, as by default, unless ``in_process``)."""
    for source in captured:
        shutil.copy(source, folder / source.name)
    trace, plan = (folder / source.name for source in captured)
    return [*KDVFS, "run", "--policy", str(plan), "--trace", str(trace), "--cpu-test-mode", "--nvml-module", NVML,
            "--gpu-index", "0", "--json", "--ab-share", "0",
            *(["--daemon", str(daemon.socket)] if daemon else []), *(["--in-process"] if in_process else []),
            "--", *TINY_GPT, "--steps", str(steps)]


def _as_nobody(folder: Path) -> dict[str, Any]:
    """``subprocess`` options that run a command as the unprivileged user ``nobody`` in ``folder``."""
    environment = {**fake_environment(folder, permitted=None), "HOME": str(folder), "TMPDIR": str(folder)}
    return {"user": NOBODY, "group": NOBODY, "extra_groups": [], "env": environment}


def _nobody_runs_python() -> bool:
    try:
        return subprocess.run([sys.executable, "-c", "pass"], user=NOBODY, group=NOBODY, extra_groups=[],
                              check=False).returncode == 0
    except OSError:
        return False


def _unprivileged(how: str, folder: Path) -> dict[str, Any]:
    """How an unprivileged client runs: as ``nobody`` (root only), or with credentials that may not lock clocks."""
    if how == "nobody":
        if os.geteuid() != 0:
            pytest.skip("dropping to the unprivileged user nobody needs root")
        if not _nobody_runs_python():
            pytest.skip(f"nobody cannot run this Python ({sys.executable}: a folder on its path is closed to others)")
        return _as_nobody(folder)
    return {"env": fake_environment(folder, permitted=False)}


@pytest.mark.parametrize("how", ["nobody", "no-permission"])
def test_an_unprivileged_run_through_the_daemon_sets_and_restores_its_clocks(how: str, captured: tuple[Path, Path],
                                                                            open_folder: Path) -> None:
    """The same run without the daemon is refused (no permission); through it, its clocks are set (by the daemon,
    for the client's uid) and restored."""
    client = _unprivileged(how, open_folder)
    group = "nogroup" if _group_exists("nogroup") else grp.getgrgid(os.getgid()).gr_name
    daemon = start_daemon(open_folder, *(["--group", group] if how == "nobody" else []))
    try:
        refused = subprocess.run(_run_argv(captured, open_folder, 20, None), capture_output=True, text=True,
                                 cwd=REPO_ROOT, check=False, timeout=300, **client)
        assert refused.returncode == 2 and "needs root or CAP_SYS_ADMIN" in refused.stderr, refused.stderr[-2000:]
        done = subprocess.run(_run_argv(captured, open_folder, 300, daemon), capture_output=True, text=True,
                              cwd=REPO_ROOT, check=False, timeout=300, **client)
        assert done.returncode == 0, done.stderr[-2000:]
        summary = strict_loads(done.stdout)
        validate(summary, "run-summary")
        assert summary["clock_control"] == f"daemon:{daemon.socket}" and summary["gpu_restored"], summary
        assert summary["switches"] > 0 and summary["controlled_steps"] > 0 and summary["error"] is None, summary
        locked = [r for r in daemon.records("request") if r["op"] == "lock" and r["outcome"] == "ok"]
        assert locked and all(r["uid"] == (NOBODY if how == "nobody" else os.getuid()) for r in locked)
        assert wait_for(lambda: locks(open_folder) == {}) and '"leased": {}' in daemon.state.read_text()
    finally:
        assert daemon.stop() == 0


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def _trainer_pid(parent: int) -> int:
    return int(Path(f"/proc/{parent}/task/{parent}/children").read_text().split()[0])


def test_a_sigkilled_run_through_the_daemon_has_its_gpu_reset_and_a_second_is_refused(
        captured: tuple[Path, Path], daemon: RunningDaemon, open_folder: Path) -> None:
    client = fake_environment(open_folder, permitted=False)  # it may not lock clocks itself
    first = subprocess.Popen(_run_argv(captured, open_folder, 100_000, daemon, in_process=True),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=client,
                             start_new_session=True)
    try:
        assert wait_for(lambda: "core" in locks(open_folder), 120), "the run never locked a clock"
        trainer = _trainer_pid(first.pid)
        second = subprocess.run(_run_argv(captured, open_folder, 50, daemon), capture_output=True, text=True,
                                cwd=REPO_ROOT, check=False, timeout=300, env=client)
        lines = [line for line in second.stderr.splitlines() if line.startswith("kdvfs")]
        assert second.returncode == 2 and len(lines) == 1, second.stderr[-2000:]
        assert f"leased through this kdvfs daemon by pid {trainer} " in lines[0]
        assert not _watchdogs_of(trainer)  # the daemon resets on drop: no watchdog in the user's processes
        os.kill(trainer, signal.SIGKILL)
        assert wait_for(lambda: locks(open_folder) == {}), "the daemon did not reset the killed trainer's GPU"
        code = first.wait(60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert code == 128 + signal.SIGKILL
    (drop,) = [r for r in daemon.records("drop") if r["pid"] == trainer]
    assert drop["reset"] == {"0": "ok"}
    summary = json.loads(first.stdout.read() if first.stdout else "{}")
    assert summary["clock_control"] == f"daemon:{daemon.socket}" and summary["partial"], summary


def _controller_pid(trainer: int) -> int:
    """The controller's own process among ``trainer``'s children (``kdvfs run``'s default)."""
    for child in Path(f"/proc/{trainer}/task/{trainer}/children").read_text().split():
        if b"controller_process" in Path(f"/proc/{child}/cmdline").read_bytes():
            return int(child)
    raise AssertionError(f"no controller process under the trainer {trainer}")


def test_a_sigkilled_controller_process_has_its_gpu_reset_by_the_daemon_and_training_goes_on(
        captured: tuple[Path, Path], daemon: RunningDaemon, open_folder: Path) -> None:
    """The controller in a process of its own holds the lease: a second run is refused naming it, and when it is
    SIGKILLed the daemon resets the GPU on the dropped connection while the trainer keeps training at auto."""
    client = fake_environment(open_folder, permitted=False)
    first = subprocess.Popen(_run_argv(captured, open_folder, 100_000, daemon), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=client, start_new_session=True)
    try:
        assert wait_for(lambda: "core" in locks(open_folder), 120), "the run never locked a clock"
        controller = _controller_pid(_trainer_pid(first.pid))
        second = subprocess.run(_run_argv(captured, open_folder, 50, daemon), capture_output=True, text=True,
                                cwd=REPO_ROOT, check=False, timeout=300, env=client)
        lines = [line for line in second.stderr.splitlines() if line.startswith("kdvfs")]
        assert second.returncode == 2 and len(lines) == 1, second.stderr[-2000:]
        assert f"leased through this kdvfs daemon by pid {controller} " in lines[0]
        os.kill(controller, signal.SIGKILL)
        assert wait_for(lambda: locks(open_folder) == {}), "the daemon did not reset the killed controller's GPU"
        assert wait_for(lambda: any(r["pid"] == controller for r in daemon.records("drop")))  # logged after the reset
        (drop,) = [r for r in daemon.records("drop") if r["pid"] == controller]
        assert drop["reset"] == {"0": "ok"}
        assert first.poll() is None  # the trainer trains on
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)


def _watchdogs_of(pid: int) -> list[str]:
    """The command lines of watchdog processes watching ``pid``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if "kdvfs.runtime.device.watchdog" in words and str(pid) in words:
            found.append(" ".join(words))
    return found


FORKING = ("import os, runpy, sys, time\n"
           "if os.fork() == 0:  # a worker forked without exec, which outlives the trainer\n"
           "    time.sleep(60)\n"
           "    os._exit(0)\n"
           "sys.argv = sys.argv[1:]\n"
           "sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))\n"
           "runpy.run_path(sys.argv[0], run_name='__main__')\n")
"""A training script that forks a long-lived child, then runs the script its arguments name."""


@pytest.mark.slow
def test_a_killed_trainers_gpu_is_reset_though_its_forked_child_lives_and_the_summary_says_so(
        captured: tuple[Path, Path], daemon: RunningDaemon, open_folder: Path) -> None:
    script = open_folder / "forking.py"
    script.write_text(FORKING)
    argv = _run_argv(captured, open_folder, 100_000, daemon)
    argv[argv.index("--") + 1:argv.index("--") + 2] = [sys.executable, str(script)]  # python forking.py gpt.py ...
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                           env=fake_environment(open_folder, permitted=False), start_new_session=True)
    child = None
    try:
        assert wait_for(lambda: "core" in locks(open_folder), 120), "the run never locked a clock"
        trainer = _trainer_pid(run.pid)
        child = _trainer_pid(trainer)  # the trainer's forked child
        os.kill(trainer, signal.SIGKILL)
        assert wait_for(lambda: locks(open_folder) == {}), "the GPU stayed locked while the trainer's child lived"
        assert Path(f"/proc/{child}").exists()
        out, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        if child is not None:
            os.kill(child, signal.SIGKILL)
    summary = json.loads(out)
    assert run.returncode == 128 + signal.SIGKILL and summary["gpu_restored"] is True and summary["partial"], summary
