"""Shared setup of the daemon tests: a ``kdvfs daemon`` process on the fake NVML (two H200s whose locked clocks
live in files, so the test reads what the daemon set) in a folder every user may enter."""

from __future__ import annotations

import grp
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdvfs.common.paths import REPO_ROOT

NVML = "kdvfs.runtime.testing.nvml"
KDVFS = [sys.executable, "-c", "import sys; from kdvfs.runtime.cli import main; sys.exit(main(sys.argv[1:]))"]
UUID0 = "GPU-00000000-0000-0000-0000-000000000000"
# A daemon may lock clocks, root or not (with ``False``: a process may not, even as root): the check is the only
# thing this replaces (the fake NVML obeys anyone).
PERMISSION_SHIM = ("import kdvfs.runtime.device.nvml_device as nvml\n"
                   "nvml.has_clock_permission = lambda *args: {permitted}\n")
DEADLINE_S = 10.0


def wait_for(condition: Callable[[], bool], timeout_s: float = DEADLINE_S) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def fake_environment(folder: Path, permitted: bool | None = True) -> dict[str, str]:
    """The environment of a process on the fake NVML of ``folder``; ``permitted``: whether its own credentials
    let it lock clocks, root or not (None: as they are)."""
    environment = {**os.environ, "KDVFS_FAKE_NVML": json.dumps({"gpus": 2}),
                   "KDVFS_FAKE_NVML_STATE": str(folder / "gpu.json"), "OMP_NUM_THREADS": "1"}
    environment.pop("KDVFS_DAEMON", None)
    if permitted is not None:
        shim = folder / f"shim-{permitted}"
        shim.mkdir(exist_ok=True)
        (shim / "sitecustomize.py").write_text(PERMISSION_SHIM.format(permitted=permitted))
        environment["PYTHONPATH"] = os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")])
    return environment


def locks(folder: Path, gpu: int = 0) -> dict[str, int]:
    """The fake GPU's locked clocks (``core``, ``mem``), as the daemon left them."""
    path = folder / ("gpu.json" if gpu == 0 else f"gpu.json.gpu{gpu}")
    return dict(json.loads(path.read_text())) if path.is_file() else {}


@dataclass
class RunningDaemon:
    """A ``kdvfs daemon`` process: its socket, request log and state file."""

    process: subprocess.Popen[str]
    socket: Path
    log: Path
    state: Path

    def records(self, event: str | None = None) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines() if self.log.is_file() else []
        return [r for r in map(json.loads, lines) if event is None or r["event"] == event]

    def stop(self) -> int:
        """SIGTERM, then its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)


def limit_open_files(count: int) -> Callable[[], None]:
    """A ``preexec_fn`` that sets a process's descriptor limit (soft and hard) to ``count``."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


def start_daemon(folder: Path, *options: str, prefix: Sequence[str] = (),
                 preexec_fn: Callable[[], None] | None = None) -> RunningDaemon:
    """``kdvfs daemon`` on ``folder``'s fake NVML, its socket ``folder/kdvfs.sock``, ready to answer; ``prefix``:
    a command that runs it (``setpriv ...``); ``preexec_fn``: run in its process before that."""
    socket, log = folder / "kdvfs.sock", folder / "daemon.log"
    started = log.read_text().count('"event": "start"') if log.is_file() else 0  # a log file is appended to
    process = subprocess.Popen([*prefix, *KDVFS, "daemon", "--socket", str(socket), "--nvml-module", NVML, "--log",
                                str(log), *options], cwd=REPO_ROOT, env=fake_environment(folder),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn)
    daemon = RunningDaemon(process, socket, log, folder / "kdvfs.sock.state.json")
    if not wait_for(lambda: len(daemon.records("start")) > started or process.poll() is not None, 60):
        process.kill()
    assert process.poll() is None, process.communicate()[1][-2000:]
    return daemon


HOLD = ("import sys, time\n"
        "from kdvfs.runtime.daemon.client import DaemonConnection\n"
        "connection = DaemonConnection(sys.argv[1])\n"
        "connection.request('lease', gpu=0)\n"
        "connection.request('lock', gpu=0, core_mhz=1095, mem_mhz=2201)\n"
        "print('locked', flush=True)\ntime.sleep(120)\n")
"""A client that leases fake GPU 0 through the daemon, locks it and waits to be killed."""


def start_holder(daemon: RunningDaemon, script: str = HOLD) -> subprocess.Popen[str]:
    """A client process running ``script`` (default :data:`HOLD`) with the daemon's socket as its argument, once
    it printed ``locked``."""
    process = subprocess.Popen([sys.executable, "-c", script, str(daemon.socket)], stdout=subprocess.PIPE, text=True,
                               cwd=REPO_ROOT)
    assert process.stdout is not None and process.stdout.readline().strip() == "locked"
    return process


def gid_exists(gid: int) -> bool:
    """Whether this machine has a group of id ``gid``."""
    try:
        grp.getgrgid(gid)
    except KeyError:
        return False
    return True


def end(process: subprocess.Popen[Any]) -> None:
    """SIGKILL ``process`` (if it still runs) and reap it."""
    if process.poll() is None:
        process.kill()
    process.wait()
