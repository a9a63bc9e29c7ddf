"""The GPUs a daemon serves: who holds each one, its clock requests, and the state file that outlives a crash.

:class:`GpuTable` opens one :class:`~kdvfs.runtime.device.nvml_device.NvmlDevice` per served GPU for the daemon's
lifetime (NVML stays initialised: a request costs its NVML calls only) and binds each GPU to at most one
client connection at a time. Leasing a GPU takes its :class:`~kdvfs.runtime.device.lease.GpuLease` (so a
direct ``kdvfs run`` as root and a daemon client cannot both change it; the lease file names the client, its
command line and the daemon), and records it in the state file (JSON, ``{"leased": {"INDEX": {"uuid", "pid",
"uid", "since"}}}``, written atomically) until its clocks are back at the GPU's control. A dropped connection
resets the clocks of every GPU it held, then releases them; a GPU whose reset failed stays in the state file.
On start, :meth:`GpuTable.reset_left_locked` resets every GPU the state file names (a previous daemon that
died with clients: SIGKILL, OOM kill, a crash), breaking a stale lease on it; a GPU leaves the state file only
once reset (one a running process holds the lease of is reset before its next lease). Each GPU's NVML calls
are serialised by its own lock; GPUs do not wait for each other.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from kdvfs.common.files import write_text_atomic
from kdvfs.runtime.daemon.protocol import DaemonRequestError, shown
from kdvfs.runtime.device.errors import DeviceError, DeviceIndexError
from kdvfs.runtime.device.lease import GpuLease, LeaseHeldError, LeaseHolder
from kdvfs.runtime.device.nvml_device import NvmlDevice

PEER_CREDENTIALS = struct.Struct("3i")
"""``struct ucred`` (pid, uid, gid) as ``SO_PEERCRED`` returns it."""
COMMAND_SHOWN = 160
MAX_STATE_BYTES = 1 << 20
"""The most of a state file read (an entry is ~150 bytes); a longer one is corrupt."""


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def client_command(pid: int) -> str:
    """The command line of process ``pid`` (from ``/proc``) on one line, or ``?`` when it cannot be read."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(" ".join(word.decode("utf-8", "replace").split()) for word in words if word)
    return text[:COMMAND_SHOWN] or "?"


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a connection, as the kernel reports it (``SO_PEERCRED``)."""

    pid: int
    uid: int
    gid: int

    @classmethod
    def of(cls, connection: socket.socket) -> Peer:
        raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEER_CREDENTIALS.size)
        return cls(*PEER_CREDENTIALS.unpack(raw))


@dataclass
class Holding:
    """A GPU bound to one connection: which (``connection``), whose (``peer``), since when, under which lease."""

    connection: int
    peer: Peer
    since: str
    lease: GpuLease

    def described(self) -> str:
        return f"pid {self.peer.pid} (uid {self.peer.uid}, `{client_command(self.peer.pid)}`) since {self.since}"


class ServedGpu:
    """One GPU of the table: its open device, its facts, its lock and its holder (None: free)."""

    def __init__(self, device: NvmlDevice) -> None:
        self.device = device
        self.index, self.name, self.uuid = device.index, device.name, device.uuid()
        self.supported_mhz = device.supported_clocks_mhz()
        self.lock = threading.Lock()
        self.holding: Holding | None = None

    def where(self) -> str:
        return f"GPU {self.index} ({self.uuid})"


class GpuTable:
    """The served GPUs by NVML index (``devices``, open) and the state file at ``state_path``. Thread-safe."""

    def __init__(self, devices: list[NvmlDevice], state_path: Path) -> None:
        self.gpus = {device.index: ServedGpu(device) for device in devices}
        self.state_path = state_path
        self.closing = False
        self._state_lock = threading.Lock()
        self._left: dict[str, dict[str, Any]] = {}
        """GPUs the state file names whose reset failed (kept for the next start)."""

    def gpu(self, index: object) -> ServedGpu:
        """The served GPU ``index``; :class:`DeviceIndexError` naming the served ones otherwise."""
        if isinstance(index, bool) or not isinstance(index, int) or index not in self.gpus:
            raise DeviceIndexError(f"this kdvfs daemon serves GPU(s) {', '.join(map(str, sorted(self.gpus)))}, not "
                                   f"{shown(index)!r}; pick one of them (its `--gpus` option lists what it serves)")
        return self.gpus[index]

    def lease(self, connection: int, peer: Peer, index: object) -> dict[str, Any]:
        """Bind GPU ``index`` to ``connection`` (idempotent for its holder); refused naming another holder."""
        gpu = self.gpu(index)
        with gpu.lock:
            if gpu.holding is not None and gpu.holding.connection != connection:
                raise LeaseHeldError(f"{gpu.where()} is leased through this kdvfs daemon by "
                                     f"{gpu.holding.described()}; wait for it to finish or stop it "
                                     f"(`kill {gpu.holding.peer.pid}`)")
            if gpu.holding is None:
                self._check_open()
                command = f"through kdvfs daemon pid {os.getpid()}: {client_command(peer.pid)}"
                record = LeaseHolder.this_process(gpu.index, pid=peer.pid, command=command)
                lease = GpuLease(gpu.uuid, gpu.index, record=record).acquire()
                try:
                    if gpu.device.locked or str(gpu.index) in self._left:
                        gpu.device.reset_clocks()  # a reset still owed (failed, or left at start): before any lock
                except DeviceError:
                    lease.release()
                    raise
                self._left.pop(str(gpu.index), None)
                gpu.holding = Holding(connection, peer, record.since, lease)
                self._write_state()
        return {"uuid": gpu.uuid, "name": gpu.name,
                "supported_mhz": {str(mem): list(cores) for mem, cores in gpu.supported_mhz.items()}}

    def lock(self, connection: int, index: object, core_mhz: object, mem_mhz: object) -> dict[str, Any]:
        """Lock GPU ``index``'s clocks for its holder ``connection`` (checked against its supported table)."""
        if isinstance(mem_mhz, bool) or not isinstance(mem_mhz, int) or \
                (core_mhz is not None and (isinstance(core_mhz, bool) or not isinstance(core_mhz, int))):
            raise DaemonRequestError("a lock request names whole MHz: {\"op\": \"lock\", \"gpu\": 0, \"core_mhz\": "
                                     "1095 or null, \"mem_mhz\": 2201}")
        gpu = self.gpu(index)
        with gpu.lock:
            self._check_holder(gpu, connection)
            gpu.device.lock_clocks_mhz(core_mhz, mem_mhz)
            return {"locked_mhz": list(gpu.device.locked_mhz)}

    def reset(self, connection: int, index: object) -> dict[str, Any]:
        """Return GPU ``index``'s clocks to its own control, for its holder ``connection``."""
        gpu = self.gpu(index)
        with gpu.lock:
            self._check_holder(gpu, connection)
            gpu.device.reset_clocks()
            return {"locked_mhz": list(gpu.device.locked_mhz)}

    def state(self, index: object) -> dict[str, Any]:
        """GPU ``index``'s readings, what the daemon locked and who holds it (no lease needed)."""
        gpu = self.gpu(index)
        with gpu.lock:
            holding = gpu.holding
            return {"uuid": gpu.uuid, "name": gpu.name, "clocks_mhz": list(gpu.device.clocks_mhz()),
                    "power_w": gpu.device.power_w(), "locked_mhz": list(gpu.device.locked_mhz),
                    "holder": None if holding is None else {"pid": holding.peer.pid, "uid": holding.peer.uid,
                                                            "since": holding.since},
                    "reset_pending": str(gpu.index) in self._left}

    def holds(self, connection: int) -> bool:
        """True while ``connection`` holds any GPU."""
        return any(gpu.holding is not None and gpu.holding.connection == connection for gpu in self.gpus.values())

    def drop(self, connection: int) -> dict[int, str | None]:
        """Reset and release every GPU ``connection`` held (its client is gone); each GPU's reset error or None."""
        outcomes: dict[int, str | None] = {}
        for gpu in self.gpus.values():
            with gpu.lock:
                if gpu.holding is not None and gpu.holding.connection == connection:
                    outcomes[gpu.index] = self._reset_and_release(gpu)
        return outcomes

    def reset_all(self) -> dict[int, str | None]:
        """Stop taking leases; reset and release every held GPU (SIGTERM). Each GPU's reset error or None."""
        self.closing = True
        outcomes: dict[int, str | None] = {}
        for gpu in self.gpus.values():
            with gpu.lock:
                if gpu.holding is not None:
                    outcomes[gpu.index] = self._reset_and_release(gpu)
        return outcomes

    def reset_left_locked(self) -> dict[int, str | None]:
        """Reset each GPU the state file names (a previous daemon's, which died with clients); each one's error
        or None. Its lease is taken first, a stale one broken (a lock whose recorded holder is not running); a
        GPU whose lease a running process holds is left to it and stays in the state file, reset before this
        daemon next leases it. A GPU leaves the state file only once reset; one this daemon does not serve (or
        whose UUID changed) is kept for a daemon that serves it."""
        outcomes: dict[int, str | None] = {}
        for key, entry in self._read_state().items():
            gpu = self.gpus.get(int(key))
            self._left[key] = entry
            if gpu is None or gpu.uuid != entry.get("uuid"):
                continue
            try:
                with GpuLease(gpu.uuid, gpu.index, break_stale=True, note=lambda text: None):
                    gpu.device.reset_clocks()
            except DeviceError as error:
                outcomes[gpu.index] = " ".join(str(error).split())
                continue
            outcomes[gpu.index] = None
            del self._left[key]
        self._write_state()
        return outcomes

    def _reset_and_release(self, gpu: ServedGpu) -> str | None:
        """Reset ``gpu`` (lock held by the caller), release its lease and holder; the reset's error or None."""
        holding, gpu.holding = gpu.holding, None
        assert holding is not None
        try:
            gpu.device.reset_clocks()
            error = None
        except DeviceError as failure:
            error = str(failure)
            self._left[str(gpu.index)] = self._entry(gpu, holding)
        holding.lease.release()
        self._write_state()
        return error

    def _check_holder(self, gpu: ServedGpu, connection: int) -> None:
        if gpu.holding is None or gpu.holding.connection != connection:
            who = "" if gpu.holding is None else f" (it is leased by {gpu.holding.described()})"
            raise DaemonRequestError(f"{gpu.where()} is not leased by this connection{who}; send "
                                     f"{{\"op\": \"lease\", \"gpu\": {gpu.index}}} first")
        self._check_open()

    def _check_open(self) -> None:
        if self.closing:
            raise DaemonRequestError("the kdvfs daemon is shutting down and has reset its GPUs; start it again")

    @staticmethod
    def _entry(gpu: ServedGpu, holding: Holding) -> dict[str, Any]:
        return {"uuid": gpu.uuid, "pid": holding.peer.pid, "uid": holding.peer.uid, "since": holding.since}

    def _read_state(self) -> dict[str, dict[str, Any]]:
        """The state file's GPUs (at most :data:`MAX_STATE_BYTES` read; unreadable or corrupt: none)."""
        try:
            with open(self.state_path, "rb") as state:
                data = state.read(MAX_STATE_BYTES + 1)
            leased = json.loads(data).get("leased", {}) if len(data) <= MAX_STATE_BYTES else {}
            return {str(key): dict(value) for key, value in leased.items() if str(key).isdigit()}
        except (OSError, ValueError, AttributeError, TypeError, RecursionError):
            return {}

    def _write_state(self) -> None:
        with self._state_lock:
            leased = dict(self._left)
            leased.update({str(gpu.index): self._entry(gpu, gpu.holding) for gpu in self.gpus.values()
                           if gpu.holding is not None})
            write_text_atomic(self.state_path, json.dumps({"leased": leased}, indent=1) + "\n")
