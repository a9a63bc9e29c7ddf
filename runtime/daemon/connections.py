"""What the daemon keeps per connection: how many it serves (in all and per uid), the client process whose exit
ends a connection, and the request lines of one connection, read within limits.

A connection ends when its client closes it (or dies: the kernel closes it), when the client *process* exits
even though a child it forked without ``exec`` still holds the socket (the daemon watches the pid the kernel
reported at connect, ``SO_PEERCRED``, through a pidfd, or ``/proc`` every :data:`PROC_POLL_S` where pidfds are
not available), after ``idle_timeout_s`` without a request while it holds no GPU, or at an over-long line.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import socket
import threading
import time
from dataclasses import dataclass
from types import TracebackType

from kdvfs.runtime.daemon.protocol import DaemonError
from kdvfs.runtime.device.lease_files import process_alive, process_start_ticks

FD_RESERVE = 64
"""Descriptors kept free of connections: NVML's device files, lease files, the state file, the log."""
PROC_POLL_S = 0.5
READ_BYTES = 65536
CLOSED, CLIENT_EXITED, IDLE, TOO_LONG = "closed", "client exited", "idle", "line too long"
"""Why a connection ended (the ``drop`` record's ``ending``), besides a socket error."""


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections the daemon serves at once (``max_connections``; ``max_per_uid`` of one user's) and
    how long a connection holding no GPU may stay silent (``idle_timeout_s``) before the daemon closes it."""

    max_connections: int = 64
    max_per_uid: int = 16
    idle_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_per_uid < 1 or not self.idle_timeout_s > 0:
            raise DaemonError("--max-connections and --max-connections-per-uid are at least 1 and --idle-timeout-s "
                              "is above 0")

    def within_file_limit(self) -> ConnectionLimits:
        """These limits with ``max_connections`` lowered to fit the process's descriptor limit (raised to its
        hard limit first) less :data:`FD_RESERVE`, so connections can never exhaust descriptors."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        fitting = max(1, min(self.max_connections, soft - FD_RESERVE))
        return ConnectionLimits(fitting, min(self.max_per_uid, fitting), self.idle_timeout_s)


class ConnectionCount:
    """The open connections by uid, admitted against :class:`ConnectionLimits`. Thread-safe."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._by_uid: dict[int, int] = {}
        self._lock = threading.Lock()

    def admit(self, uid: int) -> str | None:
        """Count a new connection of ``uid``; None when admitted, else why not (one line, with the fix)."""
        with self._lock:
            if sum(self._by_uid.values()) >= self.limits.max_connections:
                return (f"the kdvfs daemon serves at most {self.limits.max_connections} connections at once and has "
                        "that many; try again when some end (an administrator raises --max-connections)")
            if self._by_uid.get(uid, 0) >= self.limits.max_per_uid:
                return (f"the kdvfs daemon serves at most {self.limits.max_per_uid} connections of one user (uid "
                        f"{uid}) at once; end some of yours (finished runs, idle clients) and try again")
            self._by_uid[uid] = self._by_uid.get(uid, 0) + 1
            return None

    def leave(self, uid: int) -> None:
        """Uncount a connection of ``uid`` that ended."""
        with self._lock:
            self._by_uid[uid] -= 1
            if not self._by_uid[uid]:
                del self._by_uid[uid]

    def open(self) -> int:
        with self._lock:
            return sum(self._by_uid.values())


class ClientProcess:
    """The process ``pid`` at the other end of a connection (``SO_PEERCRED``; 0: not visible here), watched
    for its exit. A context manager that closes its pidfd."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start_ticks = process_start_ticks(pid) if pid > 0 else None
        self.pidfd: int | None = None
        if self.start_ticks is not None:
            with contextlib.suppress(OSError, AttributeError):
                self.pidfd = os.pidfd_open(pid)
                if process_start_ticks(pid) != self.start_ticks:  # pid reused in between: not our client
                    os.close(self.pidfd)
                    self.pidfd = None

    @property
    def watched(self) -> bool:
        return self.start_ticks is not None

    def exited(self) -> bool:
        """True once the watched process is gone (never for one not watched)."""
        return self.watched and not process_alive(self.pid, self.start_ticks)

    def __enter__(self) -> ClientProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class RequestLines:
    """The request lines of ``connection`` (each at most ``max_line_bytes`` long), read until it ends."""

    def __init__(self, connection: socket.socket, client: ClientProcess, max_line_bytes: int) -> None:
        self.connection, self.client, self.max_line_bytes = connection, client, max_line_bytes
        self._buffer = b""
        self._poll = select.poll()
        self._poll.register(connection.fileno(), select.POLLIN)
        if client.pidfd is not None:
            self._poll.register(client.pidfd, select.POLLIN)

    def next(self, deadline_s: float | None) -> bytes | str:
        """The next line (with its ``\\n``; an over-long one cut at ``max_line_bytes + 1`` bytes), or why the
        connection ends (:data:`CLOSED`, :data:`CLIENT_EXITED`, :data:`IDLE`; ``deadline_s``: the monotonic
        time of the idle timeout, None for none). Socket errors propagate."""
        while True:
            if b"\n" in self._buffer or len(self._buffer) > self.max_line_bytes:
                cut = self._buffer.find(b"\n") + 1 or self.max_line_bytes + 1
                line, self._buffer = self._buffer[:cut], self._buffer[cut:]
                return line
            ending = self._wait(deadline_s)
            if ending is not None:
                return ending
            chunk = self.connection.recv(READ_BYTES)
            if not chunk:
                return CLOSED
            self._buffer += chunk

    def _wait(self, deadline_s: float | None) -> str | None:
        """Until the connection is readable (None), the client exits or the deadline passes (why it ends)."""
        while True:
            wait_s = None if deadline_s is None else max(0.0, deadline_s - time.monotonic())
            if self.client.watched and self.client.pidfd is None:
                wait_s = PROC_POLL_S if wait_s is None else min(wait_s, PROC_POLL_S)
            ready = {fd for fd, _ in self._poll.poll(None if wait_s is None else 1e3 * wait_s)}
            if self.client.pidfd in ready or (self.client.pidfd is None and self.client.exited()):
                return CLIENT_EXITED
            if self.connection.fileno() in ready:
                return None
            if deadline_s is not None and time.monotonic() >= deadline_s:
                return IDLE
