"""The watchdog: a small process that resets a GPU's clocks if the training process dies with them locked.

``python -m kdvfs.runtime.device.watchdog PARENT_PID GPU_INDEX NVML_MODULE [OUTCOME]``, spawned by the controller (only
when it changes clocks, never in a dry run) in its own session and process group, so a Ctrl-C, a signal to
the training process group or a kill of that group (``kill -9 -PGID``) does not reach it. It imports the NVML
binding at start, holds the read end of a pipe from the training process and polls its parent every
``POLL_S`` seconds. A ``stop`` line means the controller restored the clocks itself: it exits (code 0). A
``reset`` line means the controller's own restore failed: it tries again, silently (the controller reports),
exit code 0 when the GPU is back at its own control, 1 when not. End of file without either (the training
process died: SIGKILL, a crash in native code, an OOM kill) or a parent that is gone: it resets the GPU's
clocks through NVML and says so on stderr, in one line, also when that fails. It never imports torch.
With OUTCOME (a file path) it writes there ``watching`` once started, then ``stopped`` (the controller restored
the clocks), ``restored`` (it reset them) or ``failed``: how ``kdvfs run`` learns whether a training process that
died without its summary left its GPU at its own clock control.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from kdvfs.common.errors import KdvfsError
from kdvfs.runtime.child import child_environment
from kdvfs.runtime.device.nvml_device import import_nvml, reset_gpu_clocks

POLL_S = 0.1
STOP = b"stop\n"
RESET = b"reset\n"
STOP_TIMEOUT_S = 5.0


WATCHING, STOPPED, RESTORED, FAILED = "watching", "stopped", "restored", "failed"
"""The states an OUTCOME file holds."""


def _tell(outcome: str | None, state: str) -> None:
    if outcome is not None:
        with contextlib.suppress(OSError):
            Path(outcome).write_text(state, encoding="utf-8")


def watchdog_outcome_path(report: Path) -> Path:
    """The OUTCOME file of the watchdog of the training process whose ``kdvfs run`` report is ``report``."""
    return report.with_name(report.name + ".watchdog")


def spawn_watchdog(gpu_index: int, nvml_module: str, outcome: str | None = None,
                   lease_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Start the watchdog for this process and GPU ``gpu_index``; ``outcome``: the file it reports its state to
    (see the module docstring). It inherits ``lease_fds`` (the GPU's lease, :mod:`kdvfs.runtime.device.lease`),
    so the lease stays held until it exits, after any reset it makes."""
    argv = [sys.executable, "-m", "kdvfs.runtime.device.watchdog", str(os.getpid()), str(gpu_index), nvml_module,
            *([outcome] if outcome else [])]
    _tell(outcome, WATCHING)  # before any clock can change: a missing file means the clocks never changed
    return subprocess.Popen(argv, stdin=subprocess.PIPE, env=child_environment(), start_new_session=True,
                            pass_fds=tuple(lease_fds))


def stop_watchdog(process: subprocess.Popen[bytes], restored: bool) -> bool:
    """Tell the watchdog the clocks are ``restored`` (it exits) or not (it resets them) and wait for it; True when
    the GPU is back at its own control. Idempotent: a second call answers from the watchdog's exit code."""
    try:
        if process.stdin is not None and not process.stdin.closed:
            process.stdin.write(STOP if restored else RESET)
            process.stdin.close()
        process.wait(STOP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        process.kill()
        process.wait()
    return restored or process.returncode == 0


def _parent_alive(parent_pid: int) -> bool:
    if os.getppid() != parent_pid:
        return False
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch(parent_pid: int) -> bytes:
    """Block until the parent says ``stop`` or ``reset`` (that line), or dies (``b""``)."""
    stdin = sys.stdin.buffer
    while _parent_alive(parent_pid):
        readable, _, _ = select.select([stdin], [], [], POLL_S)
        if readable:
            line = stdin.readline()
            if line in (STOP, RESET):
                return line
            if not line:
                return b""
    return b""


def main(argv: Sequence[str]) -> int:
    parent_pid, gpu_index, nvml_module = int(argv[0]), int(argv[1]), argv[2]
    outcome = argv[3] if len(argv) > 3 else None
    nvml = import_nvml(nvml_module)
    said = watch(parent_pid)
    if said == STOP:
        _tell(outcome, STOPPED)
        return 0
    try:
        name = reset_gpu_clocks(gpu_index, nvml)
    except KdvfsError as error:
        _tell(outcome, FAILED)
        if not said:
            print(f"kdvfs watchdog: training process {parent_pid} ended without restoring the clocks; {error}",
                  file=sys.stderr)
        return 1
    _tell(outcome, RESTORED)
    if not said:
        print(f"kdvfs watchdog: training process {parent_pid} ended without restoring the clocks; reset GPU "
              f"{gpu_index} ({name}) to its own clock control", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
