"""One owner per GPU (issue 44): the GPU lease, keyed by NVML UUID and held by flock; a second claimant is
refused with the holder named before any clock change; stale leases are taken over with a note; dry runs take
none; ``kdvfs reset`` refuses a live lease unless ``--force``; ``calibrate --sweep`` takes it too."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from kdvfs.runtime.cli import main
from kdvfs.runtime.controller import Controller
from kdvfs.runtime.device import lease as lease_module
from kdvfs.runtime.device import lease_files
from kdvfs.runtime.device import nvml_device as device_nvml
from kdvfs.runtime.device.lease import (
    GpuLease,
    LeaseDirectoryError,
    LeaseHeldError,
    LeaseHolder,
    lease_directory,
    read_gpu_uuid,
)
from kdvfs.runtime.device.nvml_device import NvmlDevice
from kdvfs.runtime.device.visible import cuda_device_nvml_index
from kdvfs.runtime.microbench.clock_sweep import measure_clock_sweep
from kdvfs.runtime.testing.fake_nvml import READ_ONLY_CALL, EnergyFakeNvml, h200_from_probe
from tests.runtime.controller_helpers import TRACE, write_plan

NVML = "kdvfs.runtime.testing.nvml"
UUID0 = "GPU-00000000-0000-0000-0000-000000000000"
HOLDER_COMMAND = "kdvfs run --policy plan.json --trace t.json -- python train.py"
RESETS = ["nvmlDeviceResetGpuLockedClocks", "nvmlDeviceResetMemoryLockedClocks"]
NOBODY = 65534
HOLD = ("import sys, time\n"
        "from kdvfs.runtime.device.lease import GpuLease\n"
        "GpuLease(sys.argv[1], int(sys.argv[2])).acquire()\n"
        "print('ready', flush=True)\ntime.sleep(120)\n")


@pytest.fixture
def holder() -> Iterator[subprocess.Popen[str]]:
    """A child process holding the lease of fake GPU 0 (its record names :data:`HOLDER_COMMAND`)."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, UUID0, "0"], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, lease_module.COMMAND_VARIABLE: HOLDER_COMMAND})
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    yield process
    process.kill()
    process.wait()


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_second_claimant_is_refused_with_the_holder_named(holder: subprocess.Popen[str]) -> None:
    with pytest.raises(LeaseHeldError) as refused:
        GpuLease(UUID0, 0).acquire()
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"GPU {UUID0} (index 0) is leased by pid {holder.pid} ")
    assert f"(`{HOLDER_COMMAND}`) since " in message and f"kill {holder.pid}" in message


def test_a_killed_holder_frees_the_lease_and_its_record_is_named_in_a_note(holder: subprocess.Popen[str]) -> None:
    holder.kill()
    holder.wait()
    notes: list[str] = []
    with GpuLease(UUID0, 0, note=notes.append) as lease:
        assert lease.held and lease.previous is not None and lease.previous.pid == holder.pid
        assert lease.holder() == LeaseHolder.parse(lease.path.read_text()) and lease.holder().pid == os.getpid()
    assert len(notes) == 1 and f"stale lease of pid {holder.pid} (`{HOLDER_COMMAND}`)" in notes[0]


def test_a_stale_lease_file_from_a_dead_pid_is_taken_over_with_a_note(lease_directory: Path) -> None:
    pid = _dead_pid()
    record = {"pid": pid, "command": "kdvfs calibrate --sweep", "since": "2026-01-01T00:00:00+00:00",
              "host": "node1", "gpu_index": 0}
    (lease_directory / f"{UUID0}.lease").write_text(json.dumps(record))
    notes: list[str] = []
    with GpuLease(UUID0, 0, note=notes.append):
        pass
    assert notes == [f"GPU {UUID0} (index 0): taking over the stale lease of pid {pid} (`kdvfs calibrate --sweep`) "
                     "since 2026-01-01T00:00:00+00:00 on node1, which ended without releasing it"]


def test_a_released_lease_leaves_no_record_and_is_released_on_an_exception() -> None:
    notes: list[str] = []
    with pytest.raises(RuntimeError), GpuLease(UUID0, 0, note=notes.append) as lease:
        raise RuntimeError("training failed")
    assert not lease.held and lease.path.read_text() == ""
    with GpuLease(UUID0, 0, note=notes.append) as again:
        assert again.held
    assert notes == []


def test_the_lease_is_keyed_by_uuid_whatever_cuda_visible_devices_says() -> None:
    fake = EnergyFakeNvml([h200_from_probe(0), h200_from_probe(1)])
    uuids = [read_gpu_uuid(index, fake) for index in range(2)]  # type: ignore[arg-type]
    # CUDA device 0 with CUDA_VISIBLE_DEVICES=1 and CUDA device 1 with 0,1 are one GPU: NVML GPU 1.
    first, second = cuda_device_nvml_index(0, "1", uuids), cuda_device_nvml_index(1, "0,1", uuids)
    with GpuLease(uuids[first], first):
        with pytest.raises(LeaseHeldError, match=f"GPU {uuids[1]} \\(index 1\\) is leased by pid {os.getpid()}"):
            GpuLease(uuids[second], second).acquire()
        other = cuda_device_nvml_index(0, "0", uuids)  # CUDA device 0 again, but another GPU
        with GpuLease(uuids[other], other):
            pass
    with GpuLease("GPU-same", 0), pytest.raises(LeaseHeldError, match="GPU GPU-same \\(index 3\\) is leased"):
        GpuLease("GPU-same", 3).acquire()  # one UUID seen under two indices


def test_root_leases_live_in_a_directory_only_root_may_write(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(lease_module.LEASE_DIR_VARIABLE)
    assert lease_directory(euid=0) == lease_files.SYSTEM_DIRECTORY == Path("/run/kdvfs")
    assert lease_directory({lease_module.LEASE_DIR_VARIABLE: "/elsewhere"}, euid=0) == Path("/elsewhere")
    if os.geteuid() != 0:
        pytest.skip("the system lease directory is root's")
    monkeypatch.setattr(lease_files, "SYSTEM_DIRECTORY", tmp_path / "run" / "kdvfs")
    previous = os.umask(0o077)
    try:
        with GpuLease(UUID0, 0) as lease:
            assert lease.directory == tmp_path / "run" / "kdvfs"
            folder, file = lease.directory.stat(), lease.path.stat()
            assert stat.S_IMODE(folder.st_mode) == 0o755 and folder.st_uid == 0
            assert not stat.S_IMODE(file.st_mode) & ~0o640 and file.st_uid == 0  # 0640, or what the umask left
    finally:
        os.umask(previous)


def test_a_user_without_root_gets_a_lease_directory_of_its_own(tmp_path: Path) -> None:
    assert lease_directory({}, euid=1234) == Path("/tmp/kdvfs-1234")
    runtime = tmp_path / "run-user"
    runtime.mkdir()
    assert lease_directory({"XDG_RUNTIME_DIR": str(runtime)}, euid=os.geteuid() or 1234) == \
        (runtime / "kdvfs" if os.geteuid() else Path("/tmp/kdvfs-1234"))  # not its own: /tmp
    if os.geteuid() == 0:
        os.chown(runtime, NOBODY, -1)
        assert lease_directory({"XDG_RUNTIME_DIR": str(runtime)}, euid=NOBODY) == runtime / "kdvfs"


def test_a_lease_directory_of_another_user_or_writable_by_others_is_not_trusted(
        lease_directory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lease_directory.chmod(0o1777)  # as an earlier kdvfs made it: narrowed, since it is ours
    with GpuLease(UUID0, 0) as lease:
        assert stat.S_IMODE(lease.directory.stat().st_mode) == 0o700
    if os.geteuid() != 0:
        pytest.skip("handing a directory to another user needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    monkeypatch.setenv(lease_module.LEASE_DIR_VARIABLE, str(theirs))
    with pytest.raises(LeaseDirectoryError, match=f"belongs to uid {NOBODY}, not to you .*its lease records could be "
                                                  "anyone's"):
        GpuLease(UUID0, 0).acquire()


@pytest.mark.skipif(os.geteuid() != 0, reason="files of another user need root")
def test_a_record_another_user_planted_is_discarded_not_trusted(lease_directory: Path) -> None:
    """An earlier kdvfs made lease files 0666 in a 1777 directory: anyone could write a holder (pid 1, say)."""
    planted = lease_directory / f"{UUID0}.lease"
    planted.write_text(json.dumps({"pid": 1, "command": "planted", "since": "2026-01-01T00:00:00+00:00",
                                   "host": "node1", "gpu_index": 0}))
    os.chown(planted, NOBODY, NOBODY)
    planted.chmod(0o666)
    notes: list[str] = []
    with GpuLease(UUID0, 0, note=notes.append) as lease:
        assert lease.previous is None and notes == []  # not a stale holder to take over: no holder at all
        found = lease.path.stat()
        assert found.st_uid == 0 and stat.S_IMODE(found.st_mode) == 0o640 and lease.holder().pid == os.getpid()


@pytest.fixture
def open_parent() -> Iterator[Path]:
    """A folder under /tmp every user may enter (so only the lease directory's own modes keep them out)."""
    folder = Path(tempfile.mkdtemp(prefix="kdvfs-lease-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
def test_a_user_outside_cannot_write_a_record_or_take_the_lock(monkeypatch: pytest.MonkeyPatch,
                                                               open_parent: Path) -> None:
    """``nobody`` (through /bin/sh and util-linux flock, which run as any user) against root's lease files."""
    monkeypatch.setattr(lease_files, "SYSTEM_DIRECTORY", open_parent / "kdvfs")
    monkeypatch.setenv(lease_module.LEASE_DIR_VARIABLE, str(open_parent / "kdvfs"))
    with GpuLease(UUID0, 0) as lease:
        record = lease.path.read_text()
        for command in (f"echo '{{\"pid\": 1}}' > {lease.path}", f"flock -n {lease.path} true",
                        f"touch {lease.directory}/{UUID0}.x", f"ln -s /etc/passwd {lease.directory}/x.lease"):
            done = subprocess.run(["/bin/sh", "-c", command], user=NOBODY, group=NOBODY, extra_groups=[],
                                  capture_output=True, text=True, check=False)
            assert done.returncode != 0 and "ermission denied" in done.stderr, (command, done.stderr)
        assert lease.path.read_text() == record


def test_a_lock_held_under_a_record_of_no_running_process_is_stale_and_reset_breaks_it(
        lease_directory: Path, shared_nvml: EnergyFakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger (here: a process holding the lock without a record of its own, as a forked child or a squatter
    would) under a record naming pid 1, which runs but is not the recorded process (its start time differs)."""
    path = lease_directory / f"{UUID0}.lease"
    path.write_text(json.dumps({"pid": 1, "command": "planted", "since": "2026-01-01T00:00:00+00:00",
                                "host": "node1", "gpu_index": 0, "lock_pid": 1, "lock_uid": 0,
                                "lock_start_ticks": 123456789}))
    squatter = subprocess.Popen(["flock", "-s", str(path), "sleep", "60"])
    try:
        assert _wait_locked(path)
        with pytest.raises(LeaseHeldError, match=r"is leased by pid 1 \(`planted`\) .*; it looks stale \(the "
                                                 r"process holding it, pid 1, is not running\); `sudo kdvfs reset "
                                                 "--gpu-index 0` breaks it"):
            GpuLease(UUID0, 0).acquire()
        assert main(["reset", "--nvml-module", NVML]) == 0
        captured = capsys.readouterr()
        assert "breaking the stale lease of pid 1 (`planted`)" in captured.err
        assert [c for c in shared_nvml.state.calls if c in RESETS] == RESETS
        with GpuLease(UUID0, 0):  # the lease is free again after the reset, the squatter's lock on a file gone
            assert squatter.poll() is None
    finally:
        squatter.kill()
        squatter.wait()


def _wait_locked(path: Path) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if subprocess.run(["flock", "-n", str(path), "true"], check=False).returncode != 0:
            return True
        time.sleep(0.02)
    return False


def test_a_pid_reused_by_another_process_is_not_the_holder() -> None:
    this = LeaseHolder.this_process(0)
    assert this.running() and this.lock_pid == os.getpid() and this.lock_uid == os.geteuid()
    assert not replace(this, lock_start_ticks=(this.lock_start_ticks or 0) + 1).running()  # same pid, another process
    assert not replace(this, lock_pid=_dead_pid()).running()
    assert not replace(this, lock_uid=this.lock_uid + 1).running()
    assert not LeaseHolder.parse(json.dumps({"pid": 1, "command": "c", "since": "s", "host": "h",
                                             "gpu_index": 0})).running()  # no start time recorded: unverifiable


def test_an_oversized_lease_file_is_corrupt_and_read_in_bounded_memory(lease_directory: Path) -> None:
    path = lease_directory / f"{UUID0}.lease"
    with open(path, "wb") as file:
        file.truncate(256 << 20)  # sparse: 256 MiB of zeros, no disk used
    notes: list[str] = []
    tracemalloc.start()
    try:
        with GpuLease(UUID0, 0, note=notes.append) as lease:
            peak = tracemalloc.get_traced_memory()[1]
            assert lease.previous is None and lease.holder().pid == os.getpid()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated to read a lease file"
    assert path.stat().st_size < 4096 and notes == []


def test_a_symlinked_lease_file_is_refused_saying_so(lease_directory: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    (lease_directory / f"{UUID0}.lease").symlink_to(target)
    with pytest.raises(LeaseDirectoryError, match=r"is a symbolic link; kdvfs opens lease files only without "
                                                  r"following links \(O_NOFOLLOW\): remove it"):
        GpuLease(UUID0, 0).acquire()
    assert target.read_text() == ""


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    return write_plan(tmp_path / "plan.json")


def _controller(plan_file: Path, dry_run: bool) -> Controller:
    return Controller(str(plan_file), TRACE, nvml_module=NVML, cpu_test_mode=True, dry_run=dry_run, ab_share=0.0)


def test_a_controller_is_refused_on_a_leased_gpu_before_any_clock_change(
        plan_file: Path, holder: subprocess.Popen[str], shared_nvml: EnergyFakeNvml,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_nvml, "has_clock_permission", lambda *args: True)
    with pytest.raises(LeaseHeldError, match=f"is leased by pid {holder.pid} "):
        _controller(plan_file, dry_run=False).__enter__()
    assert all(READ_ONLY_CALL.fullmatch(name) for name in shared_nvml.state.calls)
    assert not shared_nvml.state.initialised


def test_a_dry_run_takes_no_lease_and_runs_beside_the_owner(plan_file: Path, holder: subprocess.Popen[str],
                                                            shared_nvml: EnergyFakeNvml) -> None:
    """(Two dry runs in one process cannot share the in-process fake NVML, whose init is not counted; a dry
    run beside a live owner shows that it takes no lease.)"""
    with _controller(plan_file, dry_run=True) as control:
        control.step()
        control.step()
    assert control.summary is not None and control.summary.dry_run
    assert all(READ_ONLY_CALL.fullmatch(name) for name in shared_nvml.state.calls)


def test_reset_refuses_a_live_lease_unless_forced(holder: subprocess.Popen[str], shared_nvml: EnergyFakeNvml,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reset", "--nvml-module", NVML]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"is leased by pid {holder.pid} (`{HOLDER_COMMAND}`)" in err and "--force" in err
    assert not set(shared_nvml.state.calls) & set(RESETS)
    assert main(["reset", "--force", "--nvml-module", NVML]) == 0
    assert f"leased by pid {holder.pid}" in capsys.readouterr().err
    assert [c for c in shared_nvml.state.calls if c in RESETS] == RESETS


def test_reset_takes_over_a_stale_lease_with_a_note(holder: subprocess.Popen[str], shared_nvml: EnergyFakeNvml,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    holder.kill()
    holder.wait()
    assert main(["reset", "--nvml-module", NVML]) == 0
    captured = capsys.readouterr()
    assert f"taking over the stale lease of pid {holder.pid}" in captured.err
    assert "returned to the GPU's own control" in captured.out
    assert [c for c in shared_nvml.state.calls if c in RESETS] == RESETS


def test_a_clock_sweep_is_refused_on_a_leased_gpu(holder: subprocess.Popen[str],
                                                  shared_nvml: EnergyFakeNvml) -> None:
    with pytest.raises(LeaseHeldError, match=f"leased by pid {holder.pid}"), NvmlDevice(0, shared_nvml) as device:
        measure_clock_sweep(device, [(1980, 3201)], lambda name: [], settle_s=0)
    assert all(READ_ONLY_CALL.fullmatch(name) for name in shared_nvml.state.calls)


WATCHED = ("import os, sys, time\n"
           "from kdvfs.runtime.device.lease import GpuLease\n"
           "from kdvfs.runtime.device.watchdog import spawn_watchdog\n"
           "lease = GpuLease(sys.argv[1], 0).acquire()\n"
           "watchdog = spawn_watchdog(0, 'kdvfs.runtime.testing.nvml', lease_fds=(lease.fd,))\n"
           "os.close(lease.fd)  # this process's descriptor gone, as at its death; the watchdog's copy remains\n"
           "print(watchdog.pid, flush=True)\ntime.sleep(120)\n")


def test_the_watchdog_keeps_the_lease_until_its_reset_is_done(tmp_path: Path) -> None:
    log = tmp_path / "nvml.log"
    parent = subprocess.Popen([sys.executable, "-c", WATCHED, UUID0], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "KDVFS_FAKE_NVML_LOG": str(log)})
    try:
        assert parent.stdout is not None and int(parent.stdout.readline())
        with pytest.raises(LeaseHeldError, match=f"leased by pid {parent.pid} "):
            GpuLease(UUID0, 0).acquire()
        parent.kill()
        parent.wait()
        notes: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                lease = GpuLease(UUID0, 0, note=notes.append).acquire()
                break
            except LeaseHeldError:
                time.sleep(0.05)
        else:
            pytest.fail("the watchdog never released the lease")
        # The lock came free only when the watchdog exited, after both resets.
        assert log.read_text().split()[-3:] == [*RESETS, "nvmlShutdown"]
        assert len(notes) == 1 and f"stale lease of pid {parent.pid}" in notes[0]
        lease.release()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
