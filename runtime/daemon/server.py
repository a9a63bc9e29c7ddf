"""``kdvfs daemon``: the service that owns GPU clock control on a machine, for clients without root.

:func:`run_daemon` opens the served GPUs (:class:`~kdvfs.runtime.daemon.gpu_table.GpuTable`), resets what a
previous instance left locked, and listens on a Unix stream socket. The socket file gets mode ``0660`` and,
with ``group``, that group: whoever may open it may change the served GPUs' clocks, nobody else (without
``group`` only root and the daemon's own group). Each connection is served by a thread of its own, so one
client's NVML calls do not queue behind another GPU's; requests and replies follow
:mod:`kdvfs.runtime.daemon.protocol`. A connection beyond :class:`~kdvfs.runtime.daemon.connections.ConnectionLimits`
(in all, or of one uid) is answered one refusal and closed; running out of descriptors in ``accept`` is
logged and waited out, never fatal. A connection that ends (its client exited, crashed or was SIGKILLed, even
with a forked child still holding the socket; it stayed idle holding no GPU; :mod:`~kdvfs.runtime.daemon.connections`)
has every GPU it held reset at once, in its own thread. A request the daemon fails on (a malformed line, a
bug) is answered one refusal and logged; the connection goes on. Every request, each connection and drop,
and the daemon's start and stop are logged as JSON lines (``time``, ``event``, ``pid``, ``uid``, ``op``,
``gpu``, ``outcome``, ``error``), flushed per line. SIGTERM, SIGINT, SIGHUP or SIGQUIT: stop taking
requests, reset every held GPU, remove the socket file; exit code 0 for SIGTERM and SIGINT (a stop), 128 + N
for SIGHUP and SIGQUIT (a failure, which systemd restarts).
"""

from __future__ import annotations

import contextlib
import errno
import grp
import itertools
import json
import os
import signal
import socket
import stat
import struct
import sys
import threading
import time
import types
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any, NoReturn

from kdvfs.common.errors import KdvfsError
from kdvfs.runtime.daemon.connections import (
    CLOSED,
    TOO_LONG,
    ClientProcess,
    ConnectionCount,
    ConnectionLimits,
    RequestLines,
)
from kdvfs.runtime.daemon.gpu_table import GpuTable, Peer
from kdvfs.runtime.daemon.protocol import (
    MAX_LINE_BYTES,
    OPS,
    DaemonError,
    DaemonRequestError,
    decode,
    encode,
    refusal,
    shown,
)
from kdvfs.runtime.device.errors import DeviceError
from kdvfs.runtime.device.lease_files import lease_directory, prepare_directory
from kdvfs.runtime.device.nvml_device import NvmlDevice, gpu_count, import_nvml, require_clock_permission

SOCKET_MODE = 0o660
BACKLOG = 64
SEND_TIMEOUT_S = 5.0
"""How long a reply may wait for a client that does not read it before the connection ends."""
ACCEPT_RETRY_S = (0.05, 1.0)
"""The first and the longest wait after ``accept`` found no descriptor (EMFILE, ENFILE) or memory left."""
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
STOP_SIGNALS: dict[int, int] = {signal.SIGTERM: 0, signal.SIGINT: 0, signal.SIGHUP: 128 + signal.SIGHUP,
                signal.SIGQUIT: 128 + signal.SIGQUIT}
"""The signals that stop the daemon (after resetting every held GPU), with its exit code for each."""
DAEMON_NEEDS = "kdvfs daemon locks GPU clocks for its clients"
DAEMON_FIX = "run it as root (the systemd unit in deploy/ does)"


def state_path_for(socket_path: Path) -> Path:
    """The default state file of the daemon listening on ``socket_path``: ``SOCKET.state.json`` beside it."""
    return socket_path.with_name(socket_path.name + ".state.json")


class RequestLog:
    """JSON lines on ``stream``, one per event, each with the local ISO ``time`` (microseconds), flushed."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream, self._lock = stream, threading.Lock()

    def write(self, event: str, **fields: Any) -> None:
        record = {"time": datetime.now().astimezone().isoformat(timespec="microseconds"), "event": event, **fields}
        with self._lock:
            self._stream.write(json.dumps(record) + "\n")
            self._stream.flush()


def group_id(name: str | None) -> int | None:
    """The id of group ``name`` (None: no group); :class:`DaemonError` saying how to create a missing one."""
    if name is None:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise DaemonError(f"there is no group {name!r} on this machine; create it (`sudo groupadd {name}`) and add "
                          f"the users who may set clocks (`sudo usermod -aG {name} USER`)") from None


def _clear_stale_socket(path: Path) -> None:
    """Remove a socket file no daemon listens on; refuse a live one or a path that is not a socket."""
    if not path.exists() and not path.is_symlink():
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise DaemonError(f"{path} exists and is not a socket; pick another --socket path or remove it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # left by a daemon that died
        return
    finally:
        probe.close()
    raise DaemonError(f"another kdvfs daemon listens on {path}; stop it first (`sudo systemctl stop kdvfs-daemon`) "
                      "or pick another --socket path")


def listen(path: Path, gid: int | None) -> socket.socket:
    """A listening Unix socket at ``path``, mode 0660 (group ``gid`` when given) from its creation on."""
    _clear_stale_socket(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o777 & ~SOCKET_MODE)
    try:
        server.bind(str(path))
    except OSError as error:
        server.close()
        raise DaemonError(f"cannot listen on {path}: {error.strerror}; pick a --socket path in a folder you may "
                          "write") from None
    finally:
        os.umask(previous)
    os.chmod(path, SOCKET_MODE)
    if gid is not None:
        os.chown(path, -1, gid)
    server.listen(BACKLOG)
    return server


class Stop(BaseException):
    """A stop signal arrived (``signum``): raised by the accept loop at its next turn, never by the signal handler
    (an exception raised at any point of the main thread could land inside a lock that shutting down needs); it
    unwinds the accept loop to :meth:`Daemon.shutdown`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Daemon:
    """Serves ``table`` on the listening socket ``server`` (at ``socket_path``), logging to ``log``, within
    ``limits``."""

    def __init__(self, server: socket.socket, socket_path: Path, table: GpuTable, log: RequestLog,
                 limits: ConnectionLimits) -> None:
        self.server, self.socket_path, self.table, self.log, self.limits = server, socket_path, table, log, limits
        self.count = ConnectionCount(limits)
        self._ids = itertools.count(1)
        self._signum: int | None = None

    def serve_forever(self, **start: Any) -> int:
        """Log ``start`` (the ``start`` record's fields) once the stop signals are handled, accept connections
        until one arrives, then shut down (see the module docstring); the exit code."""
        previous = {signum: signal.signal(signum, self._on_stop_signal) for signum in STOP_SIGNALS}
        try:
            self.log.write("start", **start)
            self.accept_forever()
        except Stop as stop:
            return self.shutdown(stop.signum)
        except Exception as error:  # whatever broke the accept loop, the GPUs are reset first
            self.log.write("error", error=f"{type(error).__name__}: {error}")
            return self.shutdown(None)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_stop_signal(self, signum: int, frame: types.FrameType | None) -> None:
        """A stop signal: noted (the first one's exit code counts), and the listening socket shut so that a
        blocked ``accept`` returns; the accept loop raises :class:`Stop` at its next turn."""
        if self._signum is None:
            self._signum = signum
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)

    def accept_forever(self) -> NoReturn:
        """Accept connections, each served by a thread of its own; a connection over the limits is refused, a
        lack of descriptors or memory waited out. Raises :class:`Stop` once a stop signal was noted, and
        otherwise only what breaks the listening socket."""
        retry_s = ACCEPT_RETRY_S[0]
        while True:
            if self._signum is not None:
                raise Stop(self._signum)
            try:
                connection, _ = self.server.accept()
            except (ConnectionAbortedError, InterruptedError):
                continue  # a client gone before its connection was accepted
            except OSError as error:
                if self._signum is not None:
                    raise Stop(self._signum) from None
                if error.errno not in OUT_OF_RESOURCES:
                    raise
                self.log.write("accept_error", error=os.strerror(error.errno or 0), retry_s=retry_s,
                               connections=self.count.open())
                time.sleep(retry_s)
                retry_s = min(ACCEPT_RETRY_S[1], 2 * retry_s)
                continue
            retry_s = ACCEPT_RETRY_S[0]
            self.admit(connection, next(self._ids))

    def admit(self, connection: socket.socket, number: int) -> None:
        """Serve ``connection`` on a thread of its own, or refuse it in one reply when over the limits."""
        try:
            peer = Peer.of(connection)
        except OSError:
            connection.close()
            return
        refused = self.count.admit(peer.uid)
        if refused is not None:
            self.log.write("refuse", connection=number, pid=peer.pid, uid=peer.uid, error=refused)
            with connection, contextlib.suppress(OSError):
                connection.setblocking(False)
                connection.send(encode(refusal(DaemonRequestError(refused))))
            return
        try:
            threading.Thread(target=self.serve, args=(connection, number, peer), daemon=True).start()
        except RuntimeError as error:  # no thread left (a task limit): refused like a connection over the limits
            self.count.leave(peer.uid)
            self.log.write("refuse", connection=number, pid=peer.pid, uid=peer.uid, error=str(error))
            connection.close()

    def shutdown(self, signum: int | None) -> int:
        """Ignore further stop signals, close and remove the socket, reset every held GPU; the exit code for
        ``signum`` (:data:`STOP_SIGNALS`; None, an error: 1)."""
        for other in STOP_SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        self.server.close()
        with contextlib.suppress(OSError):
            self.socket_path.unlink()
        outcomes = self.table.reset_all()
        self.log.write("stop", signal=None if signum is None else signal.Signals(signum).name,
                       reset={str(gpu): error or "ok" for gpu, error in outcomes.items()})
        return 1 if signum is None else STOP_SIGNALS[signum]

    def serve(self, connection: socket.socket, number: int, peer: Peer) -> None:
        """Answer ``connection``'s requests until it ends (its client closed it or exited, it stayed idle
        holding no GPU, an over-long line), then reset what it held."""
        who = {"connection": number, "pid": peer.pid, "uid": peer.uid}
        self.log.write("connect", **who)
        ending = CLOSED
        try:
            with connection, ClientProcess(peer.pid) as client:
                seconds = int(SEND_TIMEOUT_S)  # a kernel send timeout: no poll() before every send, as settimeout has
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                                      struct.pack("ll", seconds, int(1e6 * (SEND_TIMEOUT_S - seconds))))
                lines = RequestLines(connection, client, MAX_LINE_BYTES)
                last_s = time.monotonic()
                while True:
                    deadline_s = None if self.table.holds(number) else last_s + self.limits.idle_timeout_s
                    line = lines.next(deadline_s)
                    if isinstance(line, str):
                        ending = line
                        break
                    connection.sendall(encode(self.answer(line, number, peer, who)))
                    last_s = time.monotonic()
                    if len(line) > MAX_LINE_BYTES:
                        ending = TOO_LONG  # the rest of an over-long line cannot be told from the next request
                        break
        except BlockingIOError:
            ending = f"replies not read for {SEND_TIMEOUT_S:g} s"
        except OSError as error:
            ending = f"socket error: {error.strerror or error}"  # a client that vanished mid-reply
        finally:
            self.count.leave(peer.uid)
            outcomes = self.table.drop(number)
            self.log.write("drop", **who, ending=ending,
                           reset={str(gpu): error or "ok" for gpu, error in outcomes.items()})

    def answer(self, line: bytes, number: int, peer: Peer, who: dict[str, int]) -> dict[str, Any]:
        """The reply to one request line (a refusal for anything the daemon does not accept or fails on),
        logged."""
        message: dict[str, Any] = {}
        failure = None
        try:
            message = decode(line)
            reply = {"ok": True, **self.dispatch(message, number, peer)}
        except (DeviceError, KdvfsError) as error:
            reply = refusal(error)
        except Exception as error:  # a request the daemon fails on must not end its thread silently
            failure = f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
            reply = refusal(DaemonRequestError(f"the kdvfs daemon failed on this request ({type(error).__name__}); "
                                               "its log has the details; send one request per line as "
                                               "docs/daemon.md describes"))
        fields = {key: shown(message[key]) for key in ("core_mhz", "mem_mhz") if key in message}
        self.log.write("request", **who, op=shown(message.get("op")), gpu=shown(message.get("gpu")),
                       **fields, outcome="ok" if reply["ok"] else "refused", error=reply.get("error"),
                       **({"failure": failure} if failure else {}))
        return reply

    def dispatch(self, message: dict[str, Any], number: int, peer: Peer) -> dict[str, Any]:
        """Carry out one decoded request; raises the error its refusal names."""
        op, gpu = message.get("op"), message.get("gpu")
        if op == "lease":
            return self.table.lease(number, peer, gpu)
        if op == "lock":
            return self.table.lock(number, gpu, message.get("core_mhz"), message.get("mem_mhz"))
        if op == "reset":
            return self.table.reset(number, gpu)
        if op == "state":
            return self.table.state(gpu)
        raise DaemonRequestError(f"the kdvfs daemon does not accept {shown(op)!r}; it accepts {', '.join(OPS)} "
                                 "(see docs/daemon.md)")


def served_indices(gpus: Sequence[int] | None, count: int) -> list[int]:
    """The GPUs to serve: ``gpus`` (each checked against the ``count`` NVML reports), or all of them."""
    if gpus is None:
        return list(range(count))
    wrong = [index for index in gpus if not 0 <= index < count]
    if wrong:
        raise DaemonError(f"--gpus names GPU(s) {', '.join(map(str, wrong))}, but NVML reports GPUs 0-{count - 1}; "
                          "list existing indices (`kdvfs gpus local`)")
    return sorted(set(gpus))


def run_daemon(socket_path: Path, group: str | None = None, gpus: Sequence[int] | None = None,
               nvml_module: str = "pynvml", state_path: Path | None = None, log: IO[str] | None = None,
               limits: ConnectionLimits | None = None) -> int:
    """Serve GPU clock control on ``socket_path`` until a stop signal (see the module docstring); the exit code.

    ``group``: the group that may use the socket; ``gpus``: the NVML indices served (default all);
    ``state_path``: the state file (default :func:`state_path_for`); ``log``: where the JSON lines go
    (default standard output); ``limits``: the connection limits (default :class:`ConnectionLimits`'s, with
    ``max_connections`` fitted to the descriptor limit). Raises a one-line :class:`DaemonError` or device
    error before listening when it cannot start (no permission, a missing group, a live daemon on the socket,
    no NVML, a lease directory it cannot trust).
    """
    require_clock_permission(needs=DAEMON_NEEDS, fix=DAEMON_FIX)
    gid = group_id(group)
    limits = (limits or ConnectionLimits()).within_file_limit()
    leases = lease_directory()
    prepare_directory(leases)
    nvml = import_nvml(nvml_module)
    requests = RequestLog(log or sys.stdout)
    with contextlib.ExitStack() as stack:
        devices = [stack.enter_context(NvmlDevice(index, nvml, check_energy=False))
                   for index in served_indices(gpus, gpu_count(nvml))]
        table = GpuTable(devices, state_path or state_path_for(socket_path))
        left = table.reset_left_locked()
        server = listen(socket_path, gid)
        return Daemon(server, socket_path, table, requests, limits).serve_forever(
            pid=os.getpid(), socket=str(socket_path), group=group, gpus=[device.index for device in devices],
            state=str(table.state_path), leases=str(leases), max_connections=limits.max_connections,
            max_connections_per_uid=limits.max_per_uid, idle_timeout_s=limits.idle_timeout_s,
            reset_left_locked={str(gpu): error or "ok" for gpu, error in left.items()})
