"""The client side: :class:`DaemonDevice`, the :class:`~kdvfs.runtime.device.interface.Device` whose clock
locks go through ``kdvfs daemon``, and how a command picks it (:func:`daemon_socket`).

A command uses the daemon only when it is told to: ``--daemon PATH`` or ``KDVFS_DAEMON=PATH``; otherwise it
uses NVML directly, as root. Nothing falls back from one to the other: a daemon that cannot be reached is a
one-line :class:`~kdvfs.runtime.daemon.protocol.DaemonError` saying how to fix it.

Readings (clocks, power, the energy counter, the supported clocks, the UUID) come from NVML directly, as
:class:`~kdvfs.runtime.device.nvml.GpuReader` reads them: they need no privilege, and the energy thread's
millisecond reads then never wait in front of a clock request. Only the lease, the clock locks and the reset
cross the socket. The daemon binds the GPU to this connection and resets it the moment the connection
ends, however this process ends (a SIGKILL included): a process using it needs no watchdog of its own.
"""

from __future__ import annotations

import os
import socket
import threading
import types
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from kdvfs.runtime.daemon.protocol import ENVIRONMENT_VARIABLE, DaemonError, decode, encode, raise_refusal
from kdvfs.runtime.device.nvml import GpuReader

NVML_CONTROL = "nvml"
"""``clock_control`` of a process that sets clocks through NVML itself (as root)."""
DAEMON_CONTROL = "daemon:{path}"
"""``clock_control`` of a process that sets them through the daemon listening at ``path``."""
UNREACHABLE_FIX = ("start it (`sudo systemctl start kdvfs-daemon`), check that you are in its socket's group "
                   "(`ls -l {path}`, `id`), or drop --daemon and unset KDVFS_DAEMON to use NVML directly (root)")


def daemon_socket(given: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The daemon socket a command uses: ``--daemon``'s value ``given``, else ``KDVFS_DAEMON``, else None
    (NVML directly)."""
    return given or environ.get(ENVIRONMENT_VARIABLE) or None


def clock_control(socket_path: str | None) -> str:
    """The ``clock_control`` a summary reports for ``socket_path`` (None: NVML directly)."""
    return NVML_CONTROL if socket_path is None else DAEMON_CONTROL.format(path=socket_path)


class DaemonConnection:
    """One connection to the daemon at ``path``: :meth:`request` sends a request and returns its reply.
    Thread-safe (one request at a time); :class:`DaemonError` when it cannot connect or the daemon is gone."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._socket.connect(self.path)
        except OSError as error:
            self._socket.close()
            raise DaemonError(f"cannot reach the kdvfs daemon at {self.path} ({error.strerror}); "
                              f"{UNREACHABLE_FIX.format(path=self.path)}") from None
        self._lines = self._socket.makefile("rb")
        self._lock = threading.Lock()

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """The daemon's reply to ``{"op": op, **fields}``; raises the error a refusal names."""
        with self._lock:
            try:
                self._socket.sendall(encode({"op": op, **fields}))
                line = self._lines.readline()
            except OSError as error:
                line, reason = b"", error.strerror
            else:
                reason = "it closed the connection"
        if not line:
            raise DaemonError(f"the kdvfs daemon at {self.path} did not answer a {op!r} request ({reason}); the "
                              "daemon resets a GPU whose client it lost; check `journalctl -u kdvfs-daemon`")
        reply = decode(line)
        raise_refusal(reply)
        return reply

    def close(self) -> None:
        """End the connection: the daemon resets and releases every GPU it leased to it."""
        self._lines.close()
        self._socket.close()


class DaemonDevice(GpuReader):
    """GPU ``index`` read through NVML (``nvml``, read-only) with its clocks locked through the daemon at
    ``socket_path``. A context manager like :class:`GpuReader`: entry also connects and checks that the
    daemon serves this GPU (same UUID); exit ends the connection, which resets the GPU if it is still locked.

    The GPU is leased on the first :meth:`has_clock_permission`, :meth:`lock_clocks_mhz` or
    :meth:`reset_clocks` (a dry run, which calls none of them, leases nothing). A GPU another client leased
    raises :class:`~kdvfs.runtime.device.lease.LeaseHeldError` naming it.
    """

    def __init__(self, socket_path: str | Path, index: int = 0, nvml: types.ModuleType | None = None,
                 check_energy: bool = True) -> None:
        super().__init__(index, nvml, check_energy)
        self.socket_path = str(socket_path)
        self.locked_mhz: tuple[int | None, int | None] = (None, None)
        self._connection: DaemonConnection | None = None
        self._leased = False

    @property
    def clock_control(self) -> str:
        """``daemon:PATH``: how this device changes clocks (the summaries' ``clock_control``)."""
        return clock_control(self.socket_path)

    def __enter__(self) -> Self:
        super().__enter__()
        try:
            self._connection = DaemonConnection(self.socket_path)
            served = self._connection.request("state", gpu=self.index)
            if served["uuid"] != self.uuid():
                raise DaemonError(f"the kdvfs daemon at {self.socket_path} calls GPU {self.index} {served['uuid']}, "
                                  f"but NVML here calls it {self.uuid()}; run the client where the daemon runs, "
                                  "outside a container that renumbers GPUs")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        try:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
        finally:
            super().__exit__(kind, error, trace)

    def _request(self, op: str, **fields: Any) -> dict[str, Any]:
        if self._connection is None:
            raise DaemonError(f"the connection to the kdvfs daemon at {self.socket_path} is closed; open the device "
                              "(`with DaemonDevice(...)`) before changing clocks")
        return self._connection.request(op, gpu=self.index, **fields)

    def lease(self) -> None:
        """Lease the GPU to this connection (idempotent)."""
        if not self._leased:
            self._request("lease")
            self._leased = True

    def has_clock_permission(self) -> bool:
        """True once the daemon leased the GPU to this connection (this call asks for the lease); a refusal
        raises its error (another holder named, a GPU the daemon does not serve)."""
        self.lease()
        return True

    def lock_clocks_mhz(self, core_mhz: int | None, mem_mhz: int) -> None:
        """Lock the memory clock at ``mem_mhz`` and the SM clock at ``core_mhz`` (None: the GPU picks it); the
        daemon checks both against the GPU's supported table and changes nothing for an unsupported one."""
        self.lease()
        reply = self._request("lock", core_mhz=core_mhz, mem_mhz=mem_mhz)
        core, mem = reply["locked_mhz"]
        self.locked_mhz = (core, mem)

    def reset_clocks(self) -> None:
        """Return both clocks to the GPU's own control (both resets tried by the daemon)."""
        self.lease()
        self._request("reset")
        self.locked_mhz = (None, None)

    def restore(self) -> None:
        """Return both clocks to the GPU's control when this device locked anything."""
        if self.locked_mhz != (None, None):
            self.reset_clocks()

    def daemon_state(self) -> dict[str, Any]:
        """The daemon's ``state`` reply for this GPU (readings, what it locked, who holds it)."""
        return self._request("state")
