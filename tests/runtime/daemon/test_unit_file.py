"""``deploy/kdvfs-daemon.service`` (issue 50): its sandbox scores "OK" (4.9 or less) in ``systemd-analyze security``
where systemd-analyze is installed; it carries every directive of that sandbox, checked line by line everywhere;
and the daemon runs (serves a lease, a lock, a reset on drop, a clean stop) under as much of it as this machine
can impose without systemd: the unit's capability bounding set, no new privileges and no writable executable
memory."""

from __future__ import annotations

import ctypes
import grp
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kdvfs.common.paths import REPO_ROOT
from kdvfs.runtime.daemon.client import DaemonConnection
from tests.runtime.daemon.daemon_helpers import gid_exists, locks, start_daemon, wait_for

UNIT = REPO_ROOT / "deploy" / "kdvfs-daemon.service"
OK_EXPOSURE = 4.9
SANDBOX = {
    "CapabilityBoundingSet": "CAP_SYS_ADMIN CAP_CHOWN", "NoNewPrivileges": "yes", "RestrictSUIDSGID": "yes",
    "DevicePolicy": "closed", "PrivateNetwork": "yes", "RestrictAddressFamilies": "AF_UNIX",
    "IPAddressDeny": "any", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
    "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes", "ProtectClock": "yes", "RestrictNamespaces": "yes", "RestrictRealtime": "yes",
    "LockPersonality": "yes", "MemoryDenyWriteExecute": "yes", "SystemCallArchitectures": "native",
    "LimitNOFILE": "4096", "TasksMax": "256", "UMask": "0027", "Restart": "always",
    "RuntimeDirectory": "kdvfs-daemon kdvfs", "RuntimeDirectoryPreserve": "yes",
}
"""Each directive of the sandbox and its value (the unit may add more)."""
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1


def _directives() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_the_unit_carries_every_directive_of_its_sandbox() -> None:
    found = _directives()
    assert {key: found.get(key, [None])[-1] for key in SANDBOX} == SANDBOX
    assert "@system-service" in found["SystemCallFilter"] and "char-nvidia* rw" in found["DeviceAllow"]
    assert "PrivateDevices" not in found and "ProcSubset" not in found  # NVML needs /dev/nvidia* and /proc/driver


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_the_unit_scores_ok_in_systemd_analyze_security(tmp_path: Path) -> None:
    unit = tmp_path / UNIT.name  # offline review of a unit file outside the unit search path
    shutil.copy(UNIT, unit)
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)], capture_output=True,
                          text=True, check=False, timeout=120)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", done.stdout)
    assert match, done.stdout[-2000:] + done.stderr[-2000:]
    assert float(match.group(1)) <= OK_EXPOSURE, match.group(0)


def _deny_write_execute() -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_MDWE)")


def _mdwe_works() -> bool:
    return subprocess.run(["true"], preexec_fn=_deny_write_execute, check=False).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_the_daemon_runs_with_only_the_units_capabilities_and_no_writable_executable_memory(
        open_folder: Path) -> None:
    if not _mdwe_works():
        pytest.skip("this kernel has no PR_SET_MDWE (Linux 6.3 and later)")
    caps = _directives()["CapabilityBoundingSet"][-1].lower().replace("cap_", "+").replace(" ", ",")  # +sys_admin,...
    group = grp.getgrgid(65534 if gid_exists(65534) else os.getgid())
    daemon = start_daemon(open_folder, "--group", group.gr_name, preexec_fn=_deny_write_execute,
                          prefix=["setpriv", "--nnp", "--bounding-set", f"-all,{caps}", "--inh-caps", "-all", "--"])
    try:
        bounding = re.search(r"CapBnd:\s*(\w+)", Path(f"/proc/{daemon.process.pid}/status").read_text())
        assert bounding and int(bounding.group(1), 16) == 1 << 21 | 1  # CAP_SYS_ADMIN (21) and CAP_CHOWN (0) only
        assert daemon.socket.stat().st_gid == group.gr_gid  # CAP_CHOWN was enough for the socket's group
        connection = DaemonConnection(daemon.socket)
        connection.request("lease", gpu=0)
        connection.request("lock", gpu=0, core_mhz=1095, mem_mhz=2201)
        assert locks(open_folder) == {"core": 1095, "mem": 2201}
        connection.close()
        assert wait_for(lambda: locks(open_folder) == {})
    finally:
        assert daemon.stop() == 0
