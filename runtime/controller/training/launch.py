"""``kdvfs run``'s parent side: run the user's command under the controller bootstrap, collect its summary.

The command is split and checked like ``kdvfs capture``'s (:func:`kdvfs.runtime.child.split_command`)
and runs in a child process of the user's Python with this kdvfs first on ``PYTHONPATH`` (under torchrun:
every worker runs the bootstrap; the ranks' reports make one job summary with per-rank rows,
:mod:`kdvfs.runtime.controller.measurement.job_summary`). While it runs,
SIGTERM is forwarded to it, and so is SIGINT unless it came from the terminal (a terminal's Ctrl-C reaches the
whole process group, the child included: forwarding it would interrupt the child twice), so that the child
restores the clocks and ends and the parent lives to report. The child does not outlive the parent unnoticed:
on Linux it gets SIGTERM when the parent dies (``PR_SET_PDEATHSIG``, a SIGKILL of ``kdvfs run`` included), and
its controller then restores the clocks (or, past that, its watchdog does).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from kdvfs.common.errors import KdvfsError
from kdvfs.runtime.child import child_environment, split_command
from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.measurement.job_summary import job_summary
from kdvfs.runtime.controller.model.run_summary import EndedSummary, JobSummary, RunSummary
from kdvfs.runtime.controller.training.ended import (
    daemon_released,
    ended_summary,
    restored,
    watchdog_states,
    with_missing_ranks,
)
from kdvfs.runtime.daemon.client import clock_control, daemon_socket
from kdvfs.runtime.device.lease import COMMAND_VARIABLE, command_line
from kdvfs.runtime.job import rank_documents

PR_SET_PDEATHSIG = 1
"""``prctl`` option (linux/prctl.h): the signal this process gets when its parent dies."""


def foreground_of_terminal() -> bool:
    """Whether this process's group is the foreground group of its controlling terminal, so that a SIGINT it gets
    most likely is the terminal's Ctrl-C, which reached its children too."""
    try:
        terminal = os.open("/dev/tty", os.O_RDONLY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(terminal) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(terminal)


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child takes SIGINT's default action (Python's KeyboardInterrupt) even when ``kdvfs
    run`` was started with SIGINT ignored (a shell's background job), since ``kdvfs run`` forwards SIGINT to it;
    and it gets SIGTERM when ``parent_pid`` dies (Linux; elsewhere nothing)."""
    def preexec() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if not sys.platform.startswith("linux"):
            return
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)
    return preexec


@contextlib.contextmanager
def _forwarding_signals(process: subprocess.Popen[bytes]) -> Iterator[None]:
    def forward(signum: int, frame: types.FrameType | None) -> None:
        if signum != signal.SIGINT or not foreground_of_terminal():
            process.send_signal(signum)

    previous_term = signal.signal(signal.SIGTERM, forward)
    previous_int = signal.signal(signal.SIGINT, forward)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


def run_controlled(command: Sequence[str], config: ControllerConfig, script_stdout: int | None = None
                   ) -> tuple[int, JobSummary | EndedSummary]:
    """Run ``command`` (``python train.py ARGS``) under the controller; its exit code and the summary.

    Raises:
        KdvfsError: the controller refused to start (a check failed; nothing was changed).
    """
    user = split_command(command, "kdvfs run")
    if user.distributed and config.gpu_index is not None:
        raise KdvfsError("under torchrun each rank controls its own GPU (CUDA device LOCAL_RANK, through "
                         "CUDA_VISIBLE_DEVICES); drop --gpu-index")
    with tempfile.TemporaryDirectory(prefix="kdvfs-run-") as name:
        folder = Path(name)
        child = replace(config, report_path=str(folder / "report.json"))
        child.save(folder / "run.json")
        argv = user.boot_argv("kdvfs.runtime.controller.training.boot", folder / "run.json")
        env = {**child_environment(config.cpu_test_mode), COMMAND_VARIABLE: command_line()}  # the lease's record
        process = subprocess.Popen(argv, env=env, stdout=script_stdout, preexec_fn=die_with_parent(os.getpid()))
        with _forwarding_signals(process):
            code = process.wait()
        code = code if code >= 0 else 128 - code
        documents = rank_documents(folder / "report.json")
        failed = [d for d in documents if d.get("status") == "error"]
        if failed:
            raise KdvfsError(str(failed[0].get("message")))
        return code, _summary(documents, folder, code, config, user.distributed)


def _summary(documents: list[dict[str, Any]], folder: Path, code: int, config: ControllerConfig,
             distributed: bool) -> JobSummary | EndedSummary:
    """The job's summary; for processes that wrote none, :mod:`~kdvfs.runtime.controller.training.ended`'s."""
    finished = [d for d in documents if d.get("summary") is not None]
    summaries = [RunSummary.from_json(d["summary"]) for d in finished]
    reported = {s.rank or 0 for s in summaries}
    states = watchdog_states(folder)
    missing = {rank: restored(state) for rank, state in states.items() if rank not in reported}
    missing.update(daemon_released(folder, skip=reported))
    ending = script_end(code)
    if not finished:
        return ended_summary(ending, missing or {0: True}, config.log, distributed,
                             clock_control(daemon_socket(config.daemon)))
    job = job_summary(summaries, [d.get("windows", []) for d in finished])
    return with_missing_ranks(job, ending, missing)


def script_end(code: int) -> str:
    """How the script ended, from its exit code (128 + N: killed by signal N)."""
    if code > 128:
        with contextlib.suppress(ValueError):
            return f"the script was killed by {signal.Signals(code - 128).name} (exit code {code})"
    return f"the script exited with code {code}"
