"""One owner per GPU: the exclusive lease a kdvfs process takes before it changes a GPU's clocks.

Every process that may change clocks (the controller of ``kdvfs run`` in each training process, ``kdvfs
calibrate --sweep``, ``kdvfs reset``, the daemon for its clients) first takes the GPU's :class:`GpuLease`;
a second claimant gets :class:`LeaseHeldError` naming the holder and changes nothing. Dry runs and read-only
commands take none. The lease is keyed by the GPU's NVML UUID and held by ``flock(LOCK_EX | LOCK_NB)`` on
``<lease directory>/<UUID>.lease`` (:mod:`~kdvfs.runtime.device.lease_files`), so a holder killed by SIGKILL
frees it; the file records the holder and the process whose descriptor holds the lock. A record under a free
lock, or a held lock whose record names no running process, is stale: taken over with a note, or refused to
an ordinary claimant and broken only by one that may (``kdvfs reset``, a restarting daemon). A child started
with the lease's descriptor (the controller's watchdog) keeps the lease until it exits. Why and how:
``docs/design/device-safety.md`` (One owner per GPU).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Self

from kdvfs.runtime.device.errors import DeviceError
from kdvfs.runtime.device.lease_files import (
    LEASE_DIR_VARIABLE,
    LeaseDirectoryError,
    directory_lock,
    lease_directory,
    open_lease_file,
    prepare_directory,
    process_alive,
    process_start_ticks,
    read_record,
    read_record_at,
)
from kdvfs.runtime.device.nvml_device import GpuReader, reset_gpu_clocks

__all__ = ["COMMAND_VARIABLE", "LEASE_DIR_VARIABLE", "GpuLease", "LeaseDirectoryError", "LeaseHeldError",
           "LeaseHolder", "command_line", "lease_directory", "read_gpu_uuid", "reset_leased_gpu_clocks"]

COMMAND_VARIABLE = "KDVFS_LEASE_COMMAND"
"""The command line a lease records, when set (``kdvfs run`` sets it to its own for the training process)."""
CLAIM_FIX = "wait for it to finish or stop it (`kill {pid}`); two processes changing one GPU's clocks undo each other's"
RESET_FIX = "wait for it to finish or stop it (`kill {pid}`), or add --force to reset its clocks under it"
STALE_FIX = "it looks stale ({why}); `sudo kdvfs reset --gpu-index {index}` breaks it and resets the GPU"
COMMAND_SHOWN = 120


class LeaseHeldError(DeviceError):
    """Another process holds the GPU's lease (it may be changing the GPU's clocks)."""


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds (or held) a GPU's lease, as its lease file records it: ``pid`` and ``command`` (for
    messages), since when, on which host, and the process whose descriptor holds the lock (``lock_pid``,
    ``lock_uid``, ``lock_start_ticks``: the holder itself, or the daemon that holds it for a client)."""

    pid: int
    command: str
    since: str
    host: str
    gpu_index: int
    lock_pid: int = 0
    lock_uid: int = -1
    lock_start_ticks: int | None = None

    @classmethod
    def this_process(cls, gpu_index: int, pid: int | None = None, command: str | None = None) -> LeaseHolder:
        """A record whose lock this process holds, for itself or (``pid``, ``command``) for a client."""
        return cls(os.getpid() if pid is None else pid, command_line() if command is None else command,
                   datetime.now().astimezone().isoformat(timespec="seconds"), socket.gethostname(), gpu_index,
                   os.getpid(), os.geteuid(), process_start_ticks(os.getpid()))

    @classmethod
    def parse(cls, text: str) -> LeaseHolder | None:
        """The holder a lease file's text records; None when it is empty or unreadable."""
        try:
            record = json.loads(text)
            ticks = record.get("lock_start_ticks")
            return cls(int(record["pid"]), str(record["command"]), str(record["since"]), str(record["host"]),
                       int(record["gpu_index"]), int(record.get("lock_pid", 0)), int(record.get("lock_uid", -1)),
                       None if ticks is None else int(ticks))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return None

    def running(self) -> bool:
        """True when the process holding the lock runs now (same pid, start time and uid as recorded)."""
        return process_alive(self.lock_pid, self.lock_start_ticks, self.lock_uid)

    def described(self) -> str:
        """``pid P (`COMMAND`) since T on HOST``, the command shortened to :data:`COMMAND_SHOWN` characters."""
        command = self.command if len(self.command) <= COMMAND_SHOWN else self.command[:COMMAND_SHOWN - 3] + "..."
        return f"pid {self.pid} (`{command}`) since {self.since} on {self.host}"


def command_line(environ: Mapping[str, str] = os.environ) -> str:
    """This process's command line as a lease records it (``KDVFS_LEASE_COMMAND`` when set)."""
    if environ.get(COMMAND_VARIABLE):
        return environ[COMMAND_VARIABLE]
    argv = sys.argv or [sys.executable]
    return shlex.join([Path(argv[0]).name or sys.executable, *argv[1:]])


def _note(text: str) -> None:
    print(f"kdvfs: {text}", file=sys.stderr)


def _staleness(text: str, too_long: bool) -> tuple[LeaseHolder | None, str | None]:
    """The holder a held lease's record names, and why it is stale (None: its lock process runs)."""
    if too_long:
        return None, "its file is longer than any lease record"
    holder = LeaseHolder.parse(text)
    if holder is None:
        return None, "no readable record names its holder"
    if not holder.running():
        return holder, f"the process holding it, pid {holder.lock_pid}, is not running"
    return holder, None


class GpuLease:
    """The exclusive lease of the GPU with NVML UUID ``uuid`` (NVML index ``gpu_index``, for messages).

    A context manager: entry takes it (:meth:`acquire`), exit releases it (:meth:`release`), on every path.
    A lease held by a running process raises :class:`LeaseHeldError` (one line: the GPU, the holder, ``fix``)
    unless ``force``, where it goes on without the lease after a ``note``. A stale lease under a free lock is
    taken over after a ``note`` naming the dead holder; one under a held lock (module docstring) is refused,
    unless ``break_stale``: then its file is replaced and the lease taken, with a ``note``. ``directory``:
    default :func:`lease_directory`. ``note`` receives one line for stderr. ``record``: the holder the lease
    file names (default: this process; ``kdvfs daemon`` names the client it holds the lease for).
    """

    def __init__(self, uuid: str, gpu_index: int, *, directory: Path | None = None, force: bool = False,
                 break_stale: bool = False, fix: str = CLAIM_FIX, note: Callable[[str], None] = _note,
                 record: LeaseHolder | None = None) -> None:
        self.uuid, self.gpu_index = uuid, gpu_index
        self.directory = lease_directory() if directory is None else directory
        self.path = self.directory / f"{uuid}.lease"
        self._force, self._break_stale, self._fix, self._note, self._record = force, break_stale, fix, note, record
        self.fd: int | None = None
        self.previous: LeaseHolder | None = None
        """The stale holder taken over, or the live one overridden with ``force``."""

    def holder(self) -> LeaseHolder | None:
        """The holder this lease's file records now (None: none recorded, or a corrupt record)."""
        text, too_long = read_record_at(self.path)
        return None if too_long else LeaseHolder.parse(text)

    def where(self) -> str:
        return f"GPU {self.uuid} (index {self.gpu_index})"

    def acquire(self) -> Self:
        """Take the lease (see the class docstring); idempotent while held."""
        if self.fd is not None:
            return self
        prepare_directory(self.directory)
        with directory_lock(self.directory):
            fd = open_lease_file(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                text, too_long = read_record(fd)
                os.close(fd)
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if not self._held_elsewhere(*_staleness(text, too_long)):
                    return self
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)  # breaks the stale lease: its lock stays on a file nobody opens again
                fd = open_lease_file(self.path)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: free unless taken without us
                except OSError:
                    os.close(fd)
                    raise LeaseHeldError(f"{self.where()} was leased again while its stale lease was broken; "
                                         "try again") from None
            else:
                text, too_long = read_record(fd)
                self.previous = None if too_long else LeaseHolder.parse(text)
                if self.previous is not None:
                    self._note(f"{self.where()}: taking over the stale lease of {self.previous.described()}, "
                               "which ended without releasing it")
            self.fd = fd
            self._write(json.dumps(asdict(self._record or LeaseHolder.this_process(self.gpu_index))))
        return self

    def _held_elsewhere(self, holder: LeaseHolder | None, stale: str | None) -> bool:
        """Refuse (or, with ``force``, note) a lease held by another process; True when it is to be broken."""
        who = "another process with no record" if holder is None else holder.described()
        if stale is not None and self._break_stale:
            self.previous = holder
            self._note(f"{self.where()}: breaking the stale lease of {who} ({stale}) and taking it")
            return True
        if self._force:
            self.previous = holder
            self._note(f"{self.where()} is leased by {who}; going on without the lease (--force)")
            return False
        fix = (STALE_FIX.format(why=stale, index=self.gpu_index) if stale is not None
               else self._fix.format(pid="PID" if holder is None else holder.pid))
        raise LeaseHeldError(f"{self.where()} is leased by {who}; {fix}")

    def _write(self, text: str) -> None:
        assert self.fd is not None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text.encode("utf-8"), 0)

    def release(self) -> None:
        """Empty the record and drop the lock (idempotent). Children that inherited the descriptor (the
        watchdog) must have exited: the lock is one for all of them."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @property
    def held(self) -> bool:
        """True while this object holds the lease."""
        return self.fd is not None

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.release()


def read_gpu_uuid(index: int, nvml: types.ModuleType | None = None) -> str:
    """The NVML UUID of GPU ``index`` (read only)."""
    with GpuReader(index, nvml, check_energy=False) as gpu:
        return gpu.uuid()


def reset_leased_gpu_clocks(index: int, nvml: types.ModuleType | None = None, force: bool = False) -> str:
    """``kdvfs reset``: return GPU ``index``'s clocks to its own control under its lease; its name.

    Raises :class:`LeaseHeldError` when a running process holds the lease, unless ``force`` (then it resets
    under it, with a note); a stale lease is taken over, or broken when a stranger or a child holds its lock,
    with a note. Raises :class:`~kdvfs.runtime.device.errors.ClockRestoreError` when the reset failed.
    """
    with GpuLease(read_gpu_uuid(index, nvml), index, force=force, break_stale=True, fix=RESET_FIX):
        return reset_gpu_clocks(index, nvml)
