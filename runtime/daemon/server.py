"""``kdvfs daemon``: the service that owns GPU clock control on a machine, for clients without root.

:func:`run_daemon` opens the served GPUs (:class:`~kdvfs.runtime.daemon.gpus.GpuTable`), resets what a
previous instance left locked, and listens on a Unix stream socket. The socket file gets mode ``0660`` and,
with ``group``, that group: whoever may open it may change the served GPUs' clocks, nobody else (without
``group`` only root and the daemon's own group). Each connection is served by a thread of its own, so one
client's NVML calls do not queue behind another GPU's; requests and replies follow
:mod:`kdvfs.runtime.daemon.protocol`. A connection that ends (its client exited, crashed or was SIGKILLed:
the kernel closes the socket) has every GPU it held reset at once, in its own thread. Every request, each
connection and drop, and the daemon's start and stop are logged as JSON lines (``time``, ``event``, ``pid``,
``uid``, ``op``, ``gpu``, ``outcome``, ``error``), flushed per line. SIGTERM or SIGINT: stop taking requests,
reset every held GPU, remove the socket file, exit code 0.
"""

from __future__ import annotations

import contextlib
import grp
import itertools
import json
import os
import signal
import socket
import stat
import sys
import threading
import types
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from kdvfs.envs.common.errors import KdvfsError
from kdvfs.runtime.daemon.gpus import GpuTable, Peer
from kdvfs.runtime.daemon.protocol import MAX_LINE_BYTES, OPS, DaemonError, DaemonRequestError, decode, encode, refusal
from kdvfs.runtime.device.errors import DeviceError
from kdvfs.runtime.device.nvml import NvmlDevice, gpu_count, import_nvml, require_clock_permission

SOCKET_MODE = 0o660
BACKLOG = 64
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


class Daemon:
    """Serves ``table`` on the listening socket ``server`` (at ``socket_path``), logging to ``log``."""

    def __init__(self, server: socket.socket, socket_path: Path, table: GpuTable, log: RequestLog) -> None:
        self.server, self.socket_path, self.table, self.log = server, socket_path, table, log
        self._ids = itertools.count(1)

    def serve_forever(self, **start: Any) -> int:
        """Log ``start`` (the ``start`` record's fields) once SIGTERM is handled, accept connections until SIGTERM
        or SIGINT, then shut down (see the module docstring); exit code 0."""
        previous = signal.signal(signal.SIGTERM, _terminate)
        try:
            self.log.write("start", **start)
            while True:
                connection, _ = self.server.accept()
                threading.Thread(target=self.serve, args=(connection, next(self._ids)), daemon=True).start()
        except (SystemExit, KeyboardInterrupt):
            return self.shutdown()
        finally:
            signal.signal(signal.SIGTERM, previous)

    def shutdown(self) -> int:
        """Close and remove the socket, reset every held GPU; exit code 0."""
        self.server.close()
        with contextlib.suppress(OSError):
            self.socket_path.unlink()
        outcomes = self.table.reset_all()
        self.log.write("stop", reset={str(gpu): error or "ok" for gpu, error in outcomes.items()})
        return 0

    def serve(self, connection: socket.socket, number: int) -> None:
        """Answer ``connection``'s requests until it ends, then reset what it held."""
        peer = Peer.of(connection)
        who = {"connection": number, "pid": peer.pid, "uid": peer.uid}
        self.log.write("connect", **who)
        try:
            with connection, connection.makefile("rb") as lines:
                while line := lines.readline(MAX_LINE_BYTES + 1):
                    reply = self.answer(line, number, peer, who)
                    connection.sendall(encode(reply))
                    if len(line) > MAX_LINE_BYTES:
                        break  # the rest of an over-long line cannot be told from the next request
        except OSError:
            pass  # a client that vanished mid-reply: the same as one that closed
        finally:
            outcomes = self.table.drop(number)
            self.log.write("drop", **who, reset={str(gpu): error or "ok" for gpu, error in outcomes.items()})

    def answer(self, line: bytes, number: int, peer: Peer, who: dict[str, int]) -> dict[str, Any]:
        """The reply to one request line (a refusal for anything the daemon does not accept), logged."""
        message: dict[str, Any] = {}
        try:
            message = decode(line)
            reply = {"ok": True, **self.dispatch(message, number, peer)}
        except (DeviceError, KdvfsError) as error:
            reply = refusal(error)
        op, gpu = message.get("op"), message.get("gpu")
        fields = {key: message[key] for key in ("core_mhz", "mem_mhz") if key in message}
        self.log.write("request", **who, op=op if isinstance(op, str) else repr(op), gpu=gpu, **fields,
                       outcome="ok" if reply["ok"] else "refused", error=reply.get("error"))
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
        raise DaemonRequestError(f"the kdvfs daemon does not accept {op!r}; it accepts {', '.join(OPS)} (see "
                                 "docs/daemon.md)")


def _terminate(signum: int, frame: types.FrameType | None) -> None:
    raise SystemExit(0)


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
               nvml_module: str = "pynvml", state_path: Path | None = None, log: IO[str] | None = None) -> int:
    """Serve GPU clock control on ``socket_path`` until SIGTERM (see the module docstring); the exit code.

    ``group``: the group that may use the socket; ``gpus``: the NVML indices served (default all);
    ``state_path``: the state file (default :func:`state_path_for`); ``log``: where the JSON lines go
    (default standard output). Raises a one-line :class:`DaemonError` or device error before listening when
    it cannot start (no permission, a missing group, a live daemon on the socket, no NVML).
    """
    require_clock_permission(needs=DAEMON_NEEDS, fix=DAEMON_FIX)
    gid = group_id(group)
    nvml = import_nvml(nvml_module)
    requests = RequestLog(log or sys.stdout)
    with contextlib.ExitStack() as stack:
        devices = [stack.enter_context(NvmlDevice(index, nvml, check_energy=False))
                   for index in served_indices(gpus, gpu_count(nvml))]
        table = GpuTable(devices, state_path or state_path_for(socket_path))
        left = table.reset_left_locked()
        server = listen(socket_path, gid)
        return Daemon(server, socket_path, table, requests).serve_forever(
            pid=os.getpid(), socket=str(socket_path), group=group, gpus=[device.index for device in devices],
            state=str(table.state_path), reset_left_locked={str(gpu): error or "ok" for gpu, error in left.items()})
