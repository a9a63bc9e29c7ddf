"""``kdvfs run``'s parent side: run the user's command under the controller bootstrap, collect its summary.

The command is split and checked like ``kdvfs capture``'s (:func:`kdvfs.runtime.child.split_command`)
and runs in a child process of the user's Python with this kdvfs first on ``PYTHONPATH`` (under torchrun:
every worker runs the bootstrap; the ranks' reports make one job summary with per-rank rows,
:mod:`kdvfs.runtime.controller.measurement.job_summary`). While it runs,
SIGTERM is forwarded to it and SIGINT is left to it (a terminal's Ctrl-C reaches the whole process group;
the child restores the clocks and ends), so that the parent lives to report.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import tempfile
import types
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from kdvfs.envs.common.errors import KdvfsError
from kdvfs.runtime.child import child_environment, split_command
from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.measurement.job_summary import job_summary
from kdvfs.runtime.controller.training.ended import ended_summary, restored, watchdog_states, with_missing_ranks
from kdvfs.runtime.job import rank_documents


@contextlib.contextmanager
def _forwarding_signals(process: subprocess.Popen[bytes]) -> Iterator[None]:
    def forward(signum: int, frame: types.FrameType | None) -> None:
        process.send_signal(signum)

    previous_term = signal.signal(signal.SIGTERM, forward)
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


def run_controlled(command: Sequence[str], config: ControllerConfig, script_stdout: int | None = None
                   ) -> tuple[int, dict[str, Any]]:
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
        process = subprocess.Popen(argv, env=child_environment(config.cpu_test_mode), stdout=script_stdout)
        with _forwarding_signals(process):
            code = process.wait()
        code = code if code >= 0 else 128 - code
        documents = rank_documents(folder / "report.json")
        failed = [d for d in documents if d.get("status") == "error"]
        if failed:
            raise KdvfsError(str(failed[0].get("message")))
        return code, _summary(documents, folder, code, config, user.distributed)


def _summary(documents: list[dict[str, Any]], folder: Path, code: int, config: ControllerConfig,
             distributed: bool) -> dict[str, Any]:
    """The job's summary; for processes that wrote none, :mod:`~kdvfs.runtime.controller.training.ended`'s."""
    finished = [d for d in documents if d.get("summary") is not None]
    reported = {d["summary"].get("rank") or 0 for d in finished}
    states = watchdog_states(folder)
    missing = {rank: restored(state) for rank, state in states.items() if rank not in reported}
    ending = script_end(code)
    if not finished:
        return ended_summary(ending, missing or {0: True}, config.log, distributed)
    summary = job_summary([d["summary"] for d in finished], [d.get("windows", []) for d in finished])
    return with_missing_ranks(summary, ending, missing)


def script_end(code: int) -> str:
    """How the script ended, from its exit code (128 + N: killed by signal N)."""
    if code > 128:
        with contextlib.suppress(ValueError):
            return f"the script was killed by {signal.Signals(code - 128).name} (exit code {code})"
    return f"the script exited with code {code}"
