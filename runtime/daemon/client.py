"""The client side: :class:`DaemonDevice`, the :class:`~kdvfs.runtime.device.interface.Device` whose clock
locks go through ``kdvfs daemon``, and how a command picks it (:func:`daemon_socket`).

A command uses the daemon only when it is told to: ``--daemon PATH`` or ``KDVFS_DAEMON=PATH``; otherwise it
uses NVML directly, as root. Nothing falls back from one to the other: a daemon that cannot be reached is a
one-line :class:`~kdvfs.runtime.daemon.protocol.DaemonError` saying how to fix it.

Readings (clocks, power, the energy counter, the supported clocks, the UUID) come from NVML directly, as
:class:`~kdvfs.runtime.device.nvml_device.GpuReader` reads them: they need no privilege, and the energy thread's
millisecond reads then never wait in front of a clock request. Only the lease, the clock locks and the reset
cross the socket. The daemon binds the GPU to this connection and resets it the moment the connection
ends, or this process exits, however it ends (a SIGKILL included): a process using it needs no watchdog of
its own. Every request waits at most ``timeout_s`` (connect and reply; default ``KDVFS_DAEMON_TIMEOUT_S``, else
:data:`DEFAULT_TIMEOUT_S`), then raises :class:`DaemonTimeoutError` and ends the connection. A child forked
from this process (without ``exec``) does not keep the connection: its copy is closed in the child.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import types
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from kdvfs.runtime.daemon.protocol import ENVIRONMENT_VARIABLE, DaemonError, decode, encode, raise_refusal
from kdvfs.runtime.device.errors import DeviceError
from kdvfs.runtime.device.nvml_device import GpuReader

NVML_CONTROL = "nvml"
"""``clock_control`` of a process that sets clocks through NVML itself (as root)."""
DAEMON_CONTROL = "daemon:{path}"
"""``clock_control`` of a process that sets them through the daemon listening at ``path``."""
UNREACHABLE_FIX = ("start it (`sudo systemctl start kdvfs-daemon`), check that you are in its socket's group "
                   "(`ls -l {path}`, `id`), or drop --daemon and unset KDVFS_DAEMON to use NVML directly (root)")
TIMEOUT_VARIABLE = "KDVFS_DAEMON_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 5.0
"""How long a client waits to connect and for each reply, unless ``KDVFS_DAEMON_TIMEOUT_S`` says otherwise."""
RESTART_WAITS = 3
"""A restore whose connection was lost waits this many timeouts for a daemon (restarted) to confirm the reset."""
_RETRY_S = 0.1


class DaemonTimeoutError(DaemonError):
    """The daemon did not accept the connection or answer a request in time (stopped, hung, overloaded)."""


class DaemonGoneError(DaemonError):
    """The daemon closed the connection (it stopped, crashed, restarted, or closed an idle connection)."""


def client_timeout_s(environ: Mapping[str, str] = os.environ) -> float:
    """The client timeout: ``KDVFS_DAEMON_TIMEOUT_S`` (seconds, above 0) when set, else :data:`DEFAULT_TIMEOUT_S`."""
    text = environ.get(TIMEOUT_VARIABLE)
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise DaemonError(f"{TIMEOUT_VARIABLE}={text!r} is not a number of seconds above 0; e.g. "
                          f"{TIMEOUT_VARIABLE}=5")
    return value


def daemon_socket(given: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The daemon socket a command uses: ``--daemon``'s value ``given``, else ``KDVFS_DAEMON``, else None
    (NVML directly)."""
    return given or environ.get(ENVIRONMENT_VARIABLE) or None


def clock_control(socket_path: str | None) -> str:
    """The ``clock_control`` a summary reports for ``socket_path`` (None: NVML directly)."""
    return NVML_CONTROL if socket_path is None else DAEMON_CONTROL.format(path=socket_path)


_OPEN: weakref.WeakSet[DaemonConnection] = weakref.WeakSet()
"""Every open connection of this process, closed in a forked child (:meth:`DaemonConnection.leave_to_parent`)."""


def _leave_to_parent() -> None:
    for connection in list(_OPEN):
        connection.leave_to_parent()


os.register_at_fork(after_in_child=_leave_to_parent)


class DaemonConnection:
    """One connection to the daemon at ``path``: :meth:`request` sends a request and returns its reply.
    Thread-safe (one request at a time); :class:`DaemonError` when it cannot connect or the daemon is gone,
    :class:`DaemonTimeoutError` after ``timeout_s`` (default :func:`client_timeout_s`) without a connection or reply.
    Its socket is close-on-exec, and closed in a child forked without ``exec``."""

    def __init__(self, path: str | Path, timeout_s: float | None = None) -> None:
        self.path = str(path)
        self.timeout_s = client_timeout_s() if timeout_s is None else timeout_s
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.settimeout(self.timeout_s)
        try:
            self._socket.connect(self.path)
        except TimeoutError:
            self._socket.close()
            raise DaemonTimeoutError(f"the kdvfs daemon at {self.path} did not accept a connection within "
                                     f"{self.timeout_s:g} s (stopped, hung or overloaded?); check `systemctl status "
                                     f"kdvfs-daemon`, or set {TIMEOUT_VARIABLE} to wait longer") from None
        except OSError as error:
            self._socket.close()
            raise DaemonError(f"cannot reach the kdvfs daemon at {self.path} ({error.strerror}); "
                              f"{UNREACHABLE_FIX.format(path=self.path)}") from None
        self._lines = self._socket.makefile("rb")
        self._lock = threading.Lock()
        self._owner = os.getpid()
        self.broken: DaemonError | None = None
        """Why the connection can no longer be used (a timeout, the daemon gone); None while it can."""
        _OPEN.add(self)

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """The daemon's reply to ``{"op": op, **fields}``; raises the error a refusal names, or a
        :class:`DaemonError` (then the connection is closed: the daemon resets what it leased to it)."""
        with self._lock:
            if self.broken is not None:
                raise type(self.broken)(str(self.broken))
            if os.getpid() != self._owner:
                raise DaemonError(f"this connection to the kdvfs daemon belongs to pid {self._owner}, which forked "
                                  "this process; open a DaemonDevice of its own here")
            line, failure = self._exchange(op, fields)
            if failure is not None:
                self.broken = failure
                self._close()
                raise failure
        reply = decode(line)
        raise_refusal(reply)
        return reply

    def _exchange(self, op: str, fields: dict[str, Any]) -> tuple[bytes, DaemonError | None]:
        """Send one request and read its reply line; the line, or the error that ends the connection."""
        sent: OSError | None = None
        try:
            self._socket.sendall(encode({"op": op, **fields}))
        except TimeoutError:
            return b"", self._timed_out(op)
        except OSError as error:
            sent = error  # the daemon may have refused this connection in a line before closing it: read it
        try:
            line = self._lines.readline()
        except TimeoutError:
            return b"", self._timed_out(op)
        except OSError as error:
            line, sent = b"", sent or error
        if line:
            return line, None
        gpu = fields.get("gpu")
        reason = "it closed the connection" if sent is None else sent.strerror or str(sent)
        return b"", DaemonGoneError(
            f"the kdvfs daemon at {self.path} did not answer a {op!r} request ({reason}): it stopped, restarted or "
            f"closed an idle connection; GPU {gpu} may still be at locked clocks until a restarted daemon resets it "
            f"(`systemctl status kdvfs-daemon`, `journalctl -u kdvfs-daemon`; or `sudo kdvfs reset --gpu-index {gpu}`)")

    def _timed_out(self, op: str) -> DaemonTimeoutError:
        return DaemonTimeoutError(f"the kdvfs daemon at {self.path} did not answer a {op!r} request within "
                                  f"{self.timeout_s:g} s (stopped, hung or overloaded?); the connection is closed, so "
                                  "a daemon that recovers resets what it held; check `systemctl status kdvfs-daemon`, "
                                  f"or set {TIMEOUT_VARIABLE} to wait longer")

    def _close(self) -> None:
        _OPEN.discard(self)
        with contextlib.suppress(OSError):
            self._lines.close()
        self._socket.close()

    def close(self) -> None:
        """End the connection: the daemon resets and releases every GPU it leased to it."""
        if os.getpid() == self._owner:
            self._close()

    def leave_to_parent(self) -> None:
        """In a child forked from the owner: close this process's copy of the socket (never shut the connection
        down, which is the parent's), so that the daemon sees the connection end when the parent ends."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        with contextlib.suppress(OSError):
            os.close(self._socket.detach())
        self.broken = DaemonError(f"this connection to the kdvfs daemon belongs to pid {self._owner}, which forked "
                                  "this process; open a DaemonDevice of its own here")
        _OPEN.discard(self)


class DaemonDevice(GpuReader):
    """GPU ``index`` read through NVML (``nvml``, read-only) with its clocks locked through the daemon at
    ``socket_path``. A context manager like :class:`GpuReader`: entry also connects and checks that the
    daemon serves this GPU (same UUID); exit ends the connection, which resets the GPU if it is still locked.

    The GPU is leased on the first :meth:`has_clock_permission`, :meth:`lock_clocks_mhz` or
    :meth:`reset_clocks` (a dry run, which calls none of them, leases nothing). A GPU another client leased
    raises :class:`~kdvfs.runtime.device.lease.LeaseHeldError` naming it. A connection the daemon closed while it
    held no lease (idle) is opened again. ``timeout_s``: each request's (default :func:`client_timeout_s`).
    ``connection_error``: the first error that ended the connection while it held the lease (None: none).
    """

    def __init__(self, socket_path: str | Path, index: int = 0, nvml: types.ModuleType | None = None,
                 check_energy: bool = True, timeout_s: float | None = None) -> None:
        super().__init__(index, nvml, check_energy)
        self.socket_path = str(socket_path)
        self.timeout_s = client_timeout_s() if timeout_s is None else timeout_s
        self.locked_mhz: tuple[int | None, int | None] = (None, None)
        self.connection_error: DaemonError | None = None
        self._connection: DaemonConnection | None = None
        self._leased = False

    @property
    def clock_control(self) -> str:
        """``daemon:PATH``: how this device changes clocks (the summaries' ``clock_control``)."""
        return clock_control(self.socket_path)

    def __enter__(self) -> Self:
        super().__enter__()
        try:
            self._connection = DaemonConnection(self.socket_path, self.timeout_s)
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
        try:
            return self._connection.request(op, gpu=self.index, **fields)
        except DaemonGoneError:
            if self._leased:
                raise
        self._connection = DaemonConnection(self.socket_path, self.timeout_s)  # closed idle: nothing held, so anew
        return self._connection.request(op, gpu=self.index, **fields)

    def _leased_request(self, op: str, **fields: Any) -> dict[str, Any]:
        """A request that needs the lease; a connection lost meanwhile is kept in ``connection_error``."""
        self.lease()
        try:
            return self._request(op, **fields)
        except DaemonError as error:
            if self._connection is not None and self._connection.broken is not None:
                self.connection_error = self.connection_error or error
            raise

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
        reply = self._leased_request("lock", core_mhz=core_mhz, mem_mhz=mem_mhz)
        core, mem = reply["locked_mhz"]
        self.locked_mhz = (core, mem)

    def reset_clocks(self) -> None:
        """Return both clocks to the GPU's own control (both resets tried by the daemon). When the connection
        is lost (a timeout, the daemon gone), the reset counts only once a daemon confirms it on a new
        connection (:meth:`confirm_released`); otherwise the connection's error is raised."""
        try:
            self._leased_request("reset")
        except DaemonError as error:
            if self.connection_error is None:
                raise
            wait_s = RESTART_WAITS * self.timeout_s
            if not self.confirm_released(wait_s):
                raise DaemonError(f"GPU {self.index} may still be at locked clocks: the connection to the kdvfs daemon "
                                  f"at {self.socket_path} was lost ({_first_clause(error)}) and no daemon confirmed a "
                                  f"reset within {wait_s:g} s; check `systemctl status kdvfs-daemon`, or run `sudo "
                                  f"kdvfs reset --gpu-index {self.index}`") from None
        self.locked_mhz = (None, None)

    def confirm_released(self, wait_s: float) -> bool:
        """True once the daemon at the socket (this one recovered, or a new one) answers, within ``wait_s``, that
        nobody of this process holds this GPU and it owes it no reset: it reset the GPU when this connection
        ended, or when it restarted."""
        return released(self.socket_path, self.index, os.getpid(), wait_s, self.timeout_s) is True

    def restore(self) -> None:
        """Return both clocks to the GPU's control when this device locked anything."""
        if self.locked_mhz != (None, None):
            self.reset_clocks()

    def daemon_state(self) -> dict[str, Any]:
        """The daemon's ``state`` reply for this GPU (readings, what it locked, who holds it)."""
        return self._request("state")


def _first_clause(error: BaseException) -> str:
    """The part of ``error``'s message before its first ``;`` (what happened, without the advice)."""
    return str(error).split(";")[0]


def released(socket_path: str, gpu: int, pid: int, wait_s: float, timeout_s: float | None = None) -> bool | None:
    """Whether the daemon at ``socket_path`` has GPU ``gpu`` back from process ``pid``: True once it answers that
    ``pid`` does not hold it and no reset of it is owed (it was reset when ``pid``'s connection ended, or by a
    restart); False when, after ``wait_s``, ``pid`` still holds it or a reset is owed; None when no daemon
    answered. Polled every 0.1 s; each try waits at most ``timeout_s``."""
    deadline = time.monotonic() + wait_s
    answer: bool | None = None
    while True:
        try:
            connection = DaemonConnection(socket_path, timeout_s)
            try:
                state = connection.request("state", gpu=gpu)
            finally:
                connection.close()
            holder = state.get("holder")
            answer = (holder is None or holder.get("pid") != pid) and not state.get("reset_pending", True)
        except DeviceError:
            pass
        if answer or time.monotonic() >= deadline:
            return answer
        time.sleep(_RETRY_S)
