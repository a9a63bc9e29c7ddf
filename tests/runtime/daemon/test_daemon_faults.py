"""``kdvfs daemon`` under faults and misuse (issue 50), over a real socket on the fake NVML: a connection flood,
idle connections, no descriptor left in ``accept``, stop signals, a client's forked child keeping its socket,
a stopped daemon (timeouts), a killed and restarted daemon, malformed requests, and the summary's
``gpu_restored`` of a run whose trainer died. Each ends with no GPU left locked and nothing claimed that the
daemon did not confirm."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kdvfs.common.paths import REPO_ROOT
from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.training import ended
from kdvfs.runtime.controller.training.launch import _summary
from kdvfs.runtime.daemon.client import DaemonConnection, DaemonDevice, DaemonGoneError, DaemonTimeoutError
from kdvfs.runtime.daemon.connections import CLIENT_EXITED, ClientProcess, ConnectionLimits, RequestLines
from kdvfs.runtime.daemon.gpu_table import GpuTable
from kdvfs.runtime.daemon.protocol import DaemonError, decode
from kdvfs.runtime.daemon.server import Daemon, RequestLog, Stop, listen
from kdvfs.runtime.device.nvml_device import NvmlDevice
from kdvfs.runtime.testing.fake_nvml import EnergyFakeNvml
from tests.runtime.daemon.daemon_helpers import (
    KDVFS,
    NVML,
    RunningDaemon,
    end,
    fake_environment,
    limit_open_files,
    locks,
    start_daemon,
    start_holder,
    wait_for,
)

LOCKED = {"core": 1095, "mem": 2201}


def _connect(path: Path) -> socket.socket:
    """A raw connection to the daemon at ``path`` (waiting while its backlog is full), reads timing out at 5 s."""
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.settimeout(5)
    deadline = time.monotonic() + 10
    while True:
        try:
            raw.connect(str(path))
            return raw
        except BlockingIOError:  # a Unix socket's full backlog: EAGAIN at once, for a socket with a timeout
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
        except OSError:
            raw.close()
            raise


def test_a_connection_flood_neither_kills_the_daemon_nor_keeps_a_gpu_locked(open_folder: Path) -> None:
    """Past its descriptor limit an unbounded daemon died in ``accept`` (EMFILE) with the GPU locked; now the
    connections beyond its limits are refused in one line and it goes on serving."""
    daemon = start_daemon(open_folder, preexec_fn=limit_open_files(160))
    holder = start_holder(daemon)
    flood: list[socket.socket] = []
    try:
        for _ in range(200):
            try:
                flood.append(_connect(daemon.socket))
            except OSError:
                break
        assert wait_for(lambda: daemon.process.poll() is not None or len(daemon.records("refuse")) >= 150)
        assert daemon.process.poll() is None, daemon.process.communicate()[1][-2000:]
        refusal = decode(flood[-1].makefile("rb").readline())
        assert refusal["ok"] is False and "serves at most 16 connections of one user (uid 0)" in refusal["error"]
        assert len(flood) == 200 and locks(open_folder) == LOCKED
        end(holder)
        assert wait_for(lambda: locks(open_folder) == {}), "the holder's GPU was not reset during the flood"
    finally:
        for raw in flood:
            raw.close()
        end(holder)
    assert wait_for(lambda: len(daemon.records("drop")) >= 16)
    connection = DaemonConnection(daemon.socket)  # serving again once the flood is gone
    try:
        assert connection.request("lease", gpu=0)["uuid"]
    finally:
        connection.close()
    assert daemon.stop() == 0


def test_an_idle_connection_holding_no_gpu_is_closed_and_a_device_reconnects(open_folder: Path,
                                                                               shared_nvml: EnergyFakeNvml) -> None:
    daemon = start_daemon(open_folder, "--idle-timeout-s", "0.5")
    idle, leased = _connect(daemon.socket), DaemonConnection(daemon.socket)
    try:
        leased.request("lease", gpu=1)
        assert idle.recv(1) == b""  # closed by the daemon after 0.5 s (the socket's own timeout is 5 s)
        assert leased.request("state", gpu=1)["holder"]["pid"] == os.getpid()  # a holder is never idle
        with DaemonDevice(daemon.socket, 0, shared_nvml) as device:
            assert wait_for(lambda: sum(r["ending"] == "idle" for r in daemon.records("drop")) >= 2)
            assert device.has_clock_permission()  # its idle connection was closed: it opened another
            device.lock_clocks_mhz(1095, 2201)
            assert locks(open_folder) == LOCKED
        assert wait_for(lambda: locks(open_folder) == {})
    finally:
        idle.close()
        leased.close()
        assert daemon.stop() == 0


class OutOfDescriptors:
    """A listening socket whose ``accept`` fails ``failures`` times with EMFILE, then accepts one connection, then
    (once ``served`` is set) stops the daemon as SIGTERM would."""

    def __init__(self, server: socket.socket, failures: int, served: threading.Event) -> None:
        self.server, self.failures, self.served, self.accepted = server, failures, served, False

    def accept(self) -> tuple[socket.socket, Any]:
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        if self.accepted:
            self.served.wait(10)
            raise Stop(signal.SIGTERM)
        self.accepted = True
        return self.server.accept()

    def close(self) -> None:
        self.server.close()


def test_no_descriptor_left_in_accept_is_logged_and_waited_out(tmp_path: Path, shared_nvml: EnergyFakeNvml) -> None:
    path = tmp_path / "kdvfs.sock"
    served, replies, log = threading.Event(), [], io.StringIO()

    def client() -> None:
        connection = DaemonConnection(path)
        try:
            replies.append(connection.request("state", gpu=0))
        finally:
            connection.close()
            served.set()

    with NvmlDevice(0, shared_nvml, check_energy=False) as device:
        server = OutOfDescriptors(listen(path, None), 2, served)
        daemon = Daemon(server, path, GpuTable([device], tmp_path / "state.json"), RequestLog(log),  # type: ignore[arg-type]
                        ConnectionLimits())
        thread = threading.Thread(target=client)
        thread.start()
        assert daemon.serve_forever() == 0
        thread.join(10)
    records = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [r["error"] for r in records if r["event"] == "accept_error"] == [os.strerror(errno.EMFILE)] * 2
    assert replies and replies[0]["ok"] and replies[0]["holder"] is None


class SignalledMidWrite(io.StringIO):
    """A log stream that receives SIGTERM in the middle of its first record's write, then writes the rest."""

    def write(self, text: str) -> int:
        if not self.getvalue():
            half = len(text) // 2
            super().write(text[:half])
            os.kill(os.getpid(), signal.SIGTERM)
            return half + super().write(text[half:])
        return super().write(text)


def test_a_stop_signal_in_the_middle_of_a_log_write_lets_the_write_end_then_stops(
        tmp_path: Path, shared_nvml: EnergyFakeNvml) -> None:
    """The handler raises nothing: an exception at any point of the main thread could land inside the log's lock
    or cut its record, and shutting down writes that log."""
    path, log = tmp_path / "kdvfs.sock", SignalledMidWrite()
    with NvmlDevice(0, shared_nvml, check_energy=False) as device:
        daemon = Daemon(listen(path, None), path, GpuTable([device], tmp_path / "state.json"), RequestLog(log),
                        ConnectionLimits())
        assert daemon.serve_forever(note="start") == 0
    records = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [r["event"] for r in records] == ["start", "stop"] and records[1]["signal"] == "SIGTERM"
    assert not path.exists()


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGHUP, 128 + signal.SIGHUP),
                                              (signal.SIGQUIT, 128 + signal.SIGQUIT), (signal.SIGINT, 0),
                                              (signal.SIGTERM, 0)])
def test_a_stop_signal_resets_every_gpu_before_the_daemon_exits(signum: int, code: int, daemon: RunningDaemon,
                                                               open_folder: Path) -> None:
    """SIGHUP and SIGQUIT exit non-zero, so that systemd (Restart=always) counts a failure and restarts it."""
    holder = start_holder(daemon)
    try:
        daemon.process.send_signal(signum)
        assert daemon.process.wait(30) == code
    finally:
        end(holder)
    assert locks(open_folder) == {} and not daemon.socket.exists()
    (stop,) = daemon.records("stop")
    assert stop["reset"] == {"0": "ok"} and stop["signal"] == signal.Signals(signum).name


FORKS = ("import os, sys, time\n"
         "from kdvfs.runtime.daemon.client import DaemonConnection\n"
         "from kdvfs.runtime.daemon.protocol import DaemonError\n"
         "connection = DaemonConnection(sys.argv[1])\n"
         "connection.request('lease', gpu=0)\n"
         "connection.request('lock', gpu=0, core_mhz=1095, mem_mhz=2201)\n"
         "fd = connection._socket.fileno()\n"
         "if os.fork() == 0:  # a DataLoader worker, say: forked, no exec\n"
         "    try:\n"
         "        os.fstat(fd)\n"
         "        os.write(1, b'open\\n')  # one write each: parent and child share the pipe\n"
         "    except OSError:\n"
         "        os.write(1, b'closed\\n')\n"
         "    try:\n"
         "        connection.request('state', gpu=0)\n"
         "        os.write(1, b'answered\\n')\n"
         "    except DaemonError:\n"
         "        os.write(1, b'refused\\n')\n"
         "    time.sleep(60)\n"
         "    os._exit(0)\n"
         "os.write(1, b'locked\\n')\ntime.sleep(120)\n")
"""A client that locks fake GPU 0 and forks a child, which reports whether it kept the connection."""

PASSES = ("import subprocess, sys, time\n"
          "from kdvfs.runtime.daemon.client import DaemonConnection\n"
          "connection = DaemonConnection(sys.argv[1])\n"
          "connection.request('lease', gpu=0)\n"
          "connection.request('lock', gpu=0, core_mhz=1095, mem_mhz=2201)\n"
          "fd = connection._socket.fileno()\n"
          "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], pass_fds=(fd,))\n"
          "print(child.pid, flush=True)\n"
          "print('locked', flush=True)\ntime.sleep(120)\n")
"""A client that locks fake GPU 0 and hands its socket to a child it starts (which the fork hook cannot close)."""


def _child_of(parent: int) -> int:
    return int(Path(f"/proc/{parent}/task/{parent}/children").read_text().split()[0])


def test_a_forked_child_does_not_keep_its_parents_connection(daemon: RunningDaemon, open_folder: Path) -> None:
    client = subprocess.Popen([sys.executable, "-c", FORKS, str(daemon.socket)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO_ROOT)
    child = None
    try:
        assert client.stdout is not None
        said = {client.stdout.readline().strip() for _ in range(3)}
        child = _child_of(client.pid)
        assert said == {"closed", "refused", "locked"}, said
        client.send_signal(signal.SIGKILL)
        client.wait()
        assert wait_for(lambda: locks(open_folder) == {}), "the GPU stayed locked while the forked child lived"
        assert Path(f"/proc/{child}").exists()
    finally:
        end(client)
        if child is not None:
            os.kill(child, signal.SIGKILL)


def test_the_daemon_resets_when_its_client_exits_though_a_child_holds_the_socket(daemon: RunningDaemon,
                                                                                 open_folder: Path) -> None:
    client = subprocess.Popen([sys.executable, "-c", PASSES, str(daemon.socket)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO_ROOT)
    assert client.stdout is not None
    child = int(client.stdout.readline())
    try:
        assert client.stdout.readline().strip() == "locked" and locks(open_folder) == LOCKED
        client.send_signal(signal.SIGKILL)
        client.wait()
        assert wait_for(lambda: locks(open_folder) == {}), "the GPU stayed locked while the child held the socket"
        assert Path(f"/proc/{child}").exists()
        assert wait_for(lambda: any(r["pid"] == client.pid for r in daemon.records("drop")))
        (drop,) = [r for r in daemon.records("drop") if r["pid"] == client.pid]
        assert drop["ending"] == CLIENT_EXITED and drop["reset"] == {"0": "ok"}
    finally:
        end(client)
        os.kill(child, signal.SIGKILL)


def test_without_a_pidfd_a_client_exit_is_seen_in_proc() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ours, theirs = socket.socketpair()
    try:
        with ClientProcess(process.pid) as client:
            assert client.pidfd is not None
            os.close(client.pidfd)
            client.pidfd = None  # as where pidfd_open is refused (an old kernel, a seccomp filter)
            lines = RequestLines(ours, client, 4096)
            theirs.sendall(b'{"op": "state"}\n')
            assert lines.next(None) == b'{"op": "state"}\n'
            process.kill()
            process.wait()
            assert lines.next(None) == CLIENT_EXITED
    finally:
        ours.close()
        theirs.close()
        end(process)


def test_a_stopped_daemon_times_out_in_one_line(daemon: RunningDaemon, open_folder: Path,
                                                shared_nvml: EnergyFakeNvml) -> None:
    daemon.process.send_signal(signal.SIGSTOP)
    try:
        done = subprocess.run([*KDVFS, "reset", "--daemon", str(daemon.socket), "--nvml-module", NVML],
                              capture_output=True, text=True, cwd=REPO_ROOT, check=False, timeout=30,
                              env={**fake_environment(open_folder), "KDVFS_DAEMON_TIMEOUT_S": "0.3"})
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "within 0.3 s" in done.stderr, done.stderr
        timed_out = r"did not answer a 'state' request within 0\.3 s .*KDVFS_DAEMON_TIMEOUT_S"
        with pytest.raises(DaemonTimeoutError, match=timed_out), DaemonDevice(daemon.socket, 0, shared_nvml,
                                                                             timeout_s=0.3):
            pass
    finally:
        daemon.process.send_signal(signal.SIGCONT)


def _controller(plan: Path, device: DaemonDevice) -> Any:
    from kdvfs.runtime.controller import Controller
    from kdvfs.runtime.testing.fake_gpu import FakeGpu, FakeStepTimeline, VirtualClock
    from tests.runtime.controller_helpers import LATENCY_MS, PLAN_BUDGET, TRACE, small_problem

    problem, clock = small_problem(), VirtualClock()
    gpu = FakeGpu(problem.costs, problem.profile, problem.latency_s, problem.stall_s, clock, True, None)
    return Controller(str(plan), TRACE, device=device, timeline=FakeStepTimeline(gpu, clock), clock=clock,
                      latency_ms=LATENCY_MS, budget=PLAN_BUDGET, window_steps=5, window_s=0.1, energy_read_every_s=0.0,
                      issue_early_ms=0.0, ab_share=0.0)


def _steps(controller: Any, count: int) -> None:
    for _ in range(count):
        controller.step()
        controller.flush()


@pytest.mark.parametrize("fault", ["stopped", "restarted"])
def test_a_live_run_whose_daemon_fails_reports_it_and_claims_only_a_confirmed_restore(
        fault: str, open_folder: Path, shared_nvml: EnergyFakeNvml, tmp_path: Path) -> None:
    """Stopped (SIGSTOP): the lock request times out, the error is in the summary and the restore is not
    claimed. Killed and restarted: the restart resets the GPU, which the summary reports as restored."""
    from tests.runtime.controller_helpers import write_plan

    plan, daemon = write_plan(tmp_path / "plan.json"), start_daemon(open_folder)
    timeout_s = 0.5 if fault == "stopped" else 2.0  # the restarted daemon must answer within 3 of them
    with DaemonDevice(daemon.socket, 0, shared_nvml, timeout_s=timeout_s) as device:
        controller = _controller(plan, device)
        with controller:
            _steps(controller, 10)
            assert locks(open_folder)
            if fault == "stopped":
                daemon.process.send_signal(signal.SIGSTOP)
            else:
                daemon.process.send_signal(signal.SIGKILL)
                daemon.process.wait()
                daemon = start_daemon(open_folder)  # as systemd restarts it: it resets what the first left locked
            _steps(controller, 10)
    summary = controller.summary
    assert summary is not None and summary.error, summary
    try:
        if fault == "stopped":
            assert "within 0.5 s" in summary.error and summary.gpu_restored is False
            assert "no daemon confirmed a reset" in summary.restore_error and locks(open_folder)
        else:
            assert "did not answer a" in summary.error and "may still be at locked clocks" in summary.error
            assert summary.gpu_restored is True and summary.restore_error is None and locks(open_folder) == {}
    finally:
        daemon.process.send_signal(signal.SIGCONT)
    assert wait_for(lambda: locks(open_folder) == {})  # the stopped daemon, resumed, resets the dropped connection
    assert daemon.stop() == 0


def test_a_dead_trainers_gpu_is_restored_in_the_summary_only_once_the_daemon_confirms_it(
        daemon: RunningDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``kdvfs run`` reports for a trainer that died without its summary and had leased its GPU through the
    daemon: not restored while the daemon still has the GPU leased to it, unknown when the daemon does not answer,
    restored once the daemon reset it."""
    monkeypatch.setattr(ended, "WATCHDOG_WAIT_S", 0.3)
    config = ControllerConfig.from_options("plan.json", "step.trace.json", daemon=str(daemon.socket))
    holder = start_holder(daemon)  # the trainer, say: still connected (a child of it may keep its socket)
    try:
        (tmp_path / "report.json.daemon").write_text(json.dumps({"socket": str(daemon.socket), "gpu": 0,
                                                                  "pid": holder.pid}))
        assert _summary([], tmp_path, 137, config, False).gpu_restored is False
        daemon.process.send_signal(signal.SIGSTOP)
        monkeypatch.setenv("KDVFS_DAEMON_TIMEOUT_S", "0.2")
        assert _summary([], tmp_path, 137, config, False).gpu_restored is None
        daemon.process.send_signal(signal.SIGCONT)
    finally:
        end(holder)
    assert wait_for(lambda: _summary([], tmp_path, 137, config, False).gpu_restored is True)
    assert _summary([], tmp_path, 137, config, False).error.startswith("the script was killed by SIGKILL")


def test_the_message_of_a_dead_daemon_does_not_promise_a_reset(daemon: RunningDaemon) -> None:
    connection = DaemonConnection(daemon.socket)
    connection.request("lease", gpu=0)
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait()
    with pytest.raises(DaemonGoneError) as gone:
        connection.request("lock", gpu=0, core_mhz=1095, mem_mhz=2201)
    message = str(gone.value)
    assert "resets a GPU whose client it lost" not in message and "\n" not in message
    assert "GPU 0 may still be at locked clocks until a restarted daemon resets it" in message
    with pytest.raises(DaemonGoneError):  # the connection stays closed
        connection.request("state", gpu=0)


def test_malformed_requests_are_refused_in_one_line_logged_and_the_connection_goes_on(daemon: RunningDaemon) -> None:
    lines = [b"[" * 3000, b"\xff\xfe\xfd", b'{"op": "state", "gpu": ' + b"[" * 900 + b"]" * 900 + b"}",
             b'{"op": "lock", "gpu": 0, "core_mhz": ' + b"9" * 4000 + b', "mem_mhz": 1}',
             b'{"op": "state", "gpu": NaN}', b'{"op": {"nested": [1, 2]}, "gpu": 0}', b'"just a string"']
    raw = _connect(daemon.socket)
    with raw, raw.makefile("rb") as replies:
        for line in lines:
            raw.sendall(line + b"\n")
            reply = replies.readline()
            assert reply.endswith(b"\n") and reply.count(b"\n") == 1, line[:40]
            refused = decode(reply)
            assert refused["ok"] is False and refused["error"] and len(refused["error"]) < 300, refused
        raw.sendall(b'{"op": "state", "gpu": 0}\n')
        assert decode(replies.readline())["ok"] is True
    requests = daemon.records("request")
    assert len(requests) == len(lines) + 1 and all(r["outcome"] == "refused" for r in requests[:-1])
    assert all(len(json.dumps(r)) < 1000 for r in requests)


def test_a_restart_breaks_a_strangers_lock_on_a_lease_and_resets_the_gpu(open_folder: Path,
                                                                         lease_directory: Path) -> None:
    """A process holding the lease file's lock that is not its recorded holder (the daemon that died) does not
    keep the restart from resetting the GPU, nor makes it drop the GPU from its state file unreset."""
    first = start_daemon(open_folder)
    holder = start_holder(first)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    end(holder)
    lease = next(lease_directory.glob("*.lease"))
    stranger = subprocess.Popen(["flock", "-s", str(lease), "sleep", "60"])
    try:
        assert wait_for(lambda: subprocess.run(["flock", "-n", str(lease), "true"], check=False).returncode != 0)
        assert locks(open_folder) == LOCKED
        second = start_daemon(open_folder)
        (start,) = second.records("start")[1:]
        assert start["reset_left_locked"] == {"0": "ok"} and locks(open_folder) == {}
        assert '"leased": {}' in second.state.read_text()
        assert second.stop() == 0
    finally:
        end(stranger)


def test_a_gpu_a_running_process_holds_at_restart_stays_owed_a_reset(open_folder: Path) -> None:
    from kdvfs.runtime.device.lease import GpuLease

    first = start_daemon(open_folder)
    holder = start_holder(first)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    end(holder)
    with GpuLease("GPU-00000000-0000-0000-0000-000000000000", 0):  # a direct root user took it in between
        second = start_daemon(open_folder)
        (start,) = second.records("start")[1:]
        assert "is leased by pid" in start["reset_left_locked"]["0"] and '"0"' in second.state.read_text()
    connection = DaemonConnection(second.socket)
    try:
        assert connection.request("state", gpu=0)["reset_pending"] is True
        connection.request("lease", gpu=0)  # the reset owed comes first
        assert locks(open_folder) == {} and connection.request("state", gpu=0)["reset_pending"] is False
    finally:
        connection.close()
    assert second.stop() == 0


def test_limits_below_one_are_refused_in_one_line(open_folder: Path) -> None:
    done = subprocess.run([*KDVFS, "daemon", "--socket", str(open_folder / "x.sock"), "--nvml-module", NVML,
                           "--max-connections", "0"], capture_output=True, text=True, cwd=REPO_ROOT, check=False,
                          timeout=60, env=fake_environment(open_folder))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "at least 1" in done.stderr, done.stderr
    with pytest.raises(DaemonError):
        ConnectionLimits(idle_timeout_s=0)
