"""``kdvfs daemon`` over a real Unix socket on the fake NVML (issue 44): the socket's permissions, the lease
bound to a connection, refusals (another holder, an unsupported clock, an unknown request), the reset when a
client's connection drops (SIGKILL), the reset of what a previous daemon left locked, SIGTERM, the GPU lease
shared with direct users, the request log, and a daemon that cannot be reached."""

from __future__ import annotations

import contextlib
import grp
import os
import signal
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from kdvfs.common.paths import REPO_ROOT
from kdvfs.runtime.daemon.client import DaemonConnection, DaemonDevice
from kdvfs.runtime.daemon.protocol import DaemonError, DaemonRequestError, decode
from kdvfs.runtime.device.errors import DeviceIndexError, UnsupportedClockError
from kdvfs.runtime.device.lease import GpuLease, LeaseHeldError
from kdvfs.runtime.testing.fake_nvml import EnergyFakeNvml, h200_probe
from tests.runtime.daemon.daemon_helpers import (
    KDVFS,
    NVML,
    UUID0,
    RunningDaemon,
    fake_environment,
    gid_exists,
    locks,
    start_daemon,
    start_holder,
    wait_for,
)


def test_the_socket_is_mode_0660_in_the_named_group(open_folder: Path) -> None:
    group = grp.getgrgid(os.getgid() if os.getgid() != 0 else 65534 if gid_exists(65534) else 0)
    daemon = start_daemon(open_folder, "--group", group.gr_name)
    try:
        mode = daemon.socket.stat()
        assert stat.S_ISSOCK(mode.st_mode) and stat.S_IMODE(mode.st_mode) == 0o660 and mode.st_gid == group.gr_gid
    finally:
        assert daemon.stop() == 0


def test_a_lease_names_the_gpu_and_a_lock_sets_its_clocks_until_the_reset(daemon: RunningDaemon,
                                                                           open_folder: Path) -> None:
    connection = DaemonConnection(daemon.socket)
    try:
        leased = connection.request("lease", gpu=0)
        assert leased["uuid"] == UUID0 and leased["name"] == h200_probe()["name"]
        assert 1095 in leased["supported_mhz"]["2201"] and set(leased["supported_mhz"]) == {"3201", "2201"}
        assert connection.request("lock", gpu=0, core_mhz=1095, mem_mhz=2201)["locked_mhz"] == [1095, 2201]
        assert locks(open_folder) == {"core": 1095, "mem": 2201} and locks(open_folder, 1) == {}
        state = connection.request("state", gpu=0)
        assert state["clocks_mhz"] == [1095, 2201] and state["holder"]["pid"] == os.getpid()
        assert connection.request("reset", gpu=0)["locked_mhz"] == [None, None] and locks(open_folder) == {}
    finally:
        connection.close()


def test_a_second_client_is_refused_naming_thestart_holder(daemon: RunningDaemon, open_folder: Path) -> None:
    holder = start_holder(daemon)
    second = DaemonConnection(daemon.socket)
    try:
        with pytest.raises(LeaseHeldError) as refused:
            second.request("lease", gpu=0)
        message = str(refused.value)
        assert "\n" not in message and f"leased through this kdvfs daemon by pid {holder.pid} (uid {os.getuid()}, " \
            in message and f"kill {holder.pid}" in message
        with pytest.raises(DaemonRequestError, match=f"not leased by this connection \\(it is leased by pid "
                                                     f"{holder.pid}"):
            second.request("reset", gpu=0)
        assert locks(open_folder) == {"core": 1095, "mem": 2201}  # the holder's clocks untouched
        assert second.request("lease", gpu=1)["uuid"].endswith("1")  # another GPU is free
    finally:
        second.close()
        holder.kill()
        holder.wait()


def test_clocks_outside_the_supported_table_are_refused_and_change_nothing(daemon: RunningDaemon,
                                                                           open_folder: Path) -> None:
    connection = DaemonConnection(daemon.socket)
    try:
        connection.request("lease", gpu=0)
        connection.request("lock", gpu=0, core_mhz=1095, mem_mhz=2201)
        for core_mhz, mem_mhz in ((1096, 2201), (1095, 2000), (3000, 3201)):
            with pytest.raises(UnsupportedClockError, match="does not support"):
                connection.request("lock", gpu=0, core_mhz=core_mhz, mem_mhz=mem_mhz)
        with pytest.raises(DaemonRequestError, match="whole MHz"):
            connection.request("lock", gpu=0, core_mhz="1095", mem_mhz=2201)
        with pytest.raises(DeviceIndexError, match="serves GPU\\(s\\) 0, 1, not 5"):
            connection.request("lease", gpu=5)
        assert locks(open_folder) == {"core": 1095, "mem": 2201}
    finally:
        connection.close()


def test_unknown_requests_are_refused_in_one_line_and_the_connection_goes_on(daemon: RunningDaemon) -> None:
    connection = DaemonConnection(daemon.socket)
    try:
        for op in ("set_power_limit", "shutdown", None):
            with pytest.raises(DaemonRequestError, match=r"does not accept .*; it accepts lease, lock, reset, state"):
                connection.request(str(op) if op else "", gpu=0)
        with pytest.raises(DaemonRequestError, match="not leased by this connection"):
            connection.request("lock", gpu=0, core_mhz=1095, mem_mhz=2201)
        assert connection.request("state", gpu=0)["holder"] is None
    finally:
        connection.close()
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(str(daemon.socket))
    with raw, raw.makefile("rb") as replies:
        for line in (b"not json\n", b"[1, 2]\n", b"x" * 5000 + b"\n"):
            raw.sendall(line)
            reply = decode(replies.readline())
            assert reply["ok"] is False and reply["kind"] == "DaemonRequestError" and "\n" not in reply["error"]
    refused = [r for r in daemon.records("request") if r["outcome"] == "refused"]
    assert len(refused) >= 7 and all(r["error"] and r["pid"] == os.getpid() for r in refused)


def test_a_sigkilled_client_has_its_gpu_reset_when_its_connection_drops(daemon: RunningDaemon,
                                                                        open_folder: Path) -> None:
    holder = start_holder(daemon)
    assert locks(open_folder) == {"core": 1095, "mem": 2201}
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert wait_for(lambda: locks(open_folder) == {}), "the daemon did not reset the dropped client's GPU"
    assert wait_for(lambda: any(r["pid"] == holder.pid for r in daemon.records("drop")))
    (drop,) = [r for r in daemon.records("drop") if r["pid"] == holder.pid]
    assert drop["reset"] == {"0": "ok"}
    assert wait_for(lambda: '"leased": {}' in daemon.state.read_text())
    with GpuLease(UUID0, 0):  # released with the reset
        pass


def test_a_restart_resets_what_the_previous_daemon_left_locked(open_folder: Path) -> None:
    first = start_daemon(open_folder)
    holder = start_holder(first)
    try:
        assert '"0"' in first.state.read_text()
        first.process.send_signal(signal.SIGKILL)  # no chance to reset: the state file remembers
        first.process.wait()
    finally:
        holder.kill()
        holder.wait()
    assert locks(open_folder) == {"core": 1095, "mem": 2201}
    second = start_daemon(open_folder)
    try:
        (start,) = second.records("start")[1:]  # the log file is appended to: the second daemon's start
        assert start["reset_left_locked"] == {"0": "ok"} and locks(open_folder) == {}
        assert '"leased": {}' in second.state.read_text()
    finally:
        assert second.stop() == 0


def test_sigterm_resets_every_gpu_removes_the_socket_and_exits_0(daemon: RunningDaemon, open_folder: Path) -> None:
    holder = start_holder(daemon)
    try:
        assert daemon.stop() == 0
    finally:
        holder.kill()
        holder.wait()
    assert locks(open_folder) == {} and not daemon.socket.exists()
    (stop,) = daemon.records("stop")
    assert stop["reset"] == {"0": "ok"}


def test_the_daemon_and_direct_users_share_the_gpu_lease(daemon: RunningDaemon) -> None:
    holder = start_holder(daemon)
    try:
        with pytest.raises(LeaseHeldError, match=f"is leased by pid {holder.pid} \\(`through kdvfs daemon pid "
                                                 f"{daemon.process.pid}: .*python -c import sys, time from "):
            GpuLease(UUID0, 0).acquire()
    finally:
        holder.kill()
        holder.wait()
    assert wait_for(lambda: bool(daemon.records("drop")))
    connection = DaemonConnection(daemon.socket)
    try:
        with GpuLease(UUID0, 0), pytest.raises(LeaseHeldError, match=f"is leased by pid {os.getpid()} "):
            connection.request("lease", gpu=0)  # a direct user holds it: the daemon does not lease it
    finally:
        connection.close()


def test_an_unreachable_daemon_is_one_line_saying_how_to_fix(open_folder: Path, shared_nvml: EnergyFakeNvml) -> None:
    missing = open_folder / "none.sock"
    with pytest.raises(DaemonError, match=r"cannot reach the kdvfs daemon at .*none\.sock .*systemctl start"), \
            DaemonDevice(missing, 0, shared_nvml):
        pass
    done = subprocess.run([*KDVFS, "reset", "--daemon", str(missing), "--nvml-module", NVML], capture_output=True,
                          text=True, cwd=REPO_ROOT, env=fake_environment(open_folder), check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("kdvfs: error: cannot reach the kdvfs daemon") and locks(open_folder) == {}


def test_kdvfs_reset_through_the_daemon_and_its_refusals(daemon: RunningDaemon, open_folder: Path) -> None:
    def reset(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*KDVFS, "reset", "--daemon", str(daemon.socket), "--nvml-module", NVML, *options],
                              capture_output=True, text=True, cwd=REPO_ROOT, env=fake_environment(open_folder),
                              check=False)

    holder = start_holder(daemon)
    try:
        refused = reset()
        assert refused.returncode == 2 and f"leased through this kdvfs daemon by pid {holder.pid}" in refused.stderr
        assert reset("--force").returncode == 2 and locks(open_folder) == {"core": 1095, "mem": 2201}
    finally:
        holder.kill()
        holder.wait()
    assert wait_for(lambda: locks(open_folder) == {})
    done = reset("--gpu-index", "1")
    assert done.returncode == 0 and "through the kdvfs daemon" in done.stdout, done.stderr


def test_a_second_daemon_on_a_live_socket_and_a_missing_group_are_refused(daemon: RunningDaemon,
                                                                          open_folder: Path) -> None:
    for options, message in ((["--socket", str(daemon.socket)], "another kdvfs daemon listens on"),
                             (["--socket", str(open_folder / "b.sock"), "--group", "no-such-group-kdvfs"],
                              "there is no group 'no-such-group-kdvfs'")):
        done = subprocess.run([*KDVFS, "daemon", "--nvml-module", NVML, *options], capture_output=True, text=True,
                              cwd=REPO_ROOT, env=fake_environment(open_folder), check=False, timeout=60)
        assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert daemon.process.poll() is None


def test_the_controller_and_so_the_callbacks_use_the_daemon_kdvfs_daemon_names(
        daemon: RunningDaemon, monkeypatch: pytest.MonkeyPatch, shared_nvml: EnergyFakeNvml) -> None:
    from kdvfs.runtime.controller.config import ControllerConfig
    from kdvfs.runtime.controller.control.opening import clock_control_of, open_device
    from kdvfs.runtime.device.nvml_device import NvmlDevice

    config = ControllerConfig.from_options("plan.json", "step.trace.json", nvml_module=NVML, gpu_index=0)
    with contextlib.ExitStack() as stack:
        device, _, _ = open_device(config, stack)
        assert isinstance(device, NvmlDevice) and clock_control_of(device) == "nvml"
    monkeypatch.setenv("KDVFS_DAEMON", str(daemon.socket))
    with contextlib.ExitStack() as stack:
        device, opened_config, _ = open_device(config, stack)
        assert isinstance(device, DaemonDevice) and opened_config.daemon == str(daemon.socket)
        assert clock_control_of(device) == f"daemon:{daemon.socket}"
        assert device.daemon_state()["holder"] is None  # opened, not leased: a dry run leases nothing
        assert device.has_clock_permission() and device.daemon_state()["holder"]["pid"] == os.getpid()
    assert wait_for(lambda: any(r["pid"] == os.getpid() and r["reset"] == {"0": "ok"}
                                for r in daemon.records("drop")))
