"""One owner per GPU: the exclusive lease a kdvfs process takes before it changes a GPU's clocks.

Two kdvfs processes changing one GPU's clocks undo each other's locks (one's reset clears the other's clocks
mid-run) and contaminate each other's measurements. So every process that may change clocks (the clock
controller of ``kdvfs run`` in each training process, ``kdvfs calibrate --sweep``, ``kdvfs reset``) first
takes the GPU's lease, :class:`GpuLease`; a second claimant gets :class:`LeaseHeldError` naming the holder
and changes nothing. Dry runs and read-only commands take none.

The lease is keyed by the GPU's NVML UUID (never by an index, which ``CUDA_VISIBLE_DEVICES`` renumbers) and
held by ``flock(LOCK_EX | LOCK_NB)`` on the file ``<lease directory>/<UUID>.lease``: the kernel drops the
lock when the last descriptor of it closes, so a holder killed by SIGKILL frees it without clean-up. The
file records the holder (pid, command line, start time, host) for the message a second claimant sees; a
clean release empties it, so a record found under a free lock is a stale lease from a holder that died,
taken over with a note. A child started with the lease's descriptor (the controller's watchdog) holds the
lock with its parent until it exits: a watchdog resetting the clocks of a dead training process keeps the
GPU's lease until its reset is done.

The lease directory (:func:`lease_directory`): ``KDVFS_LEASE_DIR`` when set; else ``/run/kdvfs`` when it
exists and is writable, or can be created (root); else ``/tmp/kdvfs-leases``. It is one directory for every
user of the machine (not ``$XDG_RUNTIME_DIR``, which is per user: two users would each "own" one GPU). A
directory kdvfs creates gets mode ``1777`` (like ``/tmp``: anyone may add a lease file, nobody may delete
another's) and a lease file mode ``0666``, so that a process of another user (root, or one with
``CAP_SYS_ADMIN``) can take over a stale lease and write its own record; files are opened with
``O_NOFOLLOW``.
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
from kdvfs.runtime.device.nvml import GpuReader, reset_gpu_clocks

LEASE_DIR_VARIABLE = "KDVFS_LEASE_DIR"
COMMAND_VARIABLE = "KDVFS_LEASE_COMMAND"
"""The command line a lease records, when set (``kdvfs run`` sets it to its own for the training process)."""
RUN_DIRECTORY = Path("/run/kdvfs")
TMP_DIRECTORY = Path("/tmp/kdvfs-leases")
SHARED_DIRECTORY_MODE = 0o1777
LEASE_FILE_MODE = 0o666
CLAIM_FIX = "wait for it to finish or stop it (`kill {pid}`); two processes changing one GPU's clocks undo each other's"
RESET_FIX = "wait for it to finish or stop it (`kill {pid}`), or add --force to reset its clocks under it"
COMMAND_SHOWN = 120


class LeaseHeldError(DeviceError):
    """Another live process holds the GPU's lease (it may be changing the GPU's clocks)."""


class LeaseDirectoryError(DeviceError):
    """The lease directory or a lease file cannot be created or opened."""


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds (or held) a GPU's lease: as its lease file records it."""

    pid: int
    command: str
    since: str
    host: str
    gpu_index: int

    @classmethod
    def this_process(cls, gpu_index: int) -> LeaseHolder:
        return cls(os.getpid(), command_line(), datetime.now().astimezone().isoformat(timespec="seconds"),
                   socket.gethostname(), gpu_index)

    @classmethod
    def parse(cls, text: str) -> LeaseHolder | None:
        """The holder a lease file's text records; None when it is empty or unreadable."""
        try:
            record = json.loads(text)
            return cls(int(record["pid"]), str(record["command"]), str(record["since"]), str(record["host"]),
                       int(record["gpu_index"]))
        except (ValueError, KeyError, TypeError):
            return None

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


def lease_directory(environ: Mapping[str, str] = os.environ) -> Path:
    """Where GPU leases live (see the module docstring)."""
    if environ.get(LEASE_DIR_VARIABLE):
        return Path(environ[LEASE_DIR_VARIABLE])
    usable = os.W_OK | os.X_OK
    if RUN_DIRECTORY.is_dir() and os.access(RUN_DIRECTORY, usable):
        return RUN_DIRECTORY
    if not RUN_DIRECTORY.exists() and os.access(RUN_DIRECTORY.parent, usable):
        return RUN_DIRECTORY
    return TMP_DIRECTORY


def _make_directory(directory: Path, shared: bool) -> None:
    if directory.is_dir():
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if shared:
            directory.chmod(SHARED_DIRECTORY_MODE)
    except OSError as error:
        raise LeaseDirectoryError(f"cannot create the GPU lease directory {directory}: {error.strerror}; set "
                                  f"{LEASE_DIR_VARIABLE} to a directory every kdvfs user of this machine can "
                                  "write") from None


def _open_lease_file(path: Path) -> int:
    """A descriptor of ``path`` (created mode 0666), read-write where allowed, else read-only (flock needs no
    write access; the record is then left as it is)."""
    flags = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags | os.O_RDWR, LEASE_FILE_MODE)
        except PermissionError:
            return os.open(path, flags | os.O_RDONLY, LEASE_FILE_MODE)
    except OSError as error:
        raise LeaseDirectoryError(f"cannot open the GPU lease file {path}: {error.strerror}; set "
                                  f"{LEASE_DIR_VARIABLE} to a directory every kdvfs user of this machine can "
                                  "write") from None
    if os.fstat(fd).st_uid == os.geteuid():
        with contextlib.suppress(OSError):
            os.fchmod(fd, LEASE_FILE_MODE)  # the umask may have narrowed it
    return fd


def _read_record(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def _note(text: str) -> None:
    print(f"kdvfs: {text}", file=sys.stderr)


class GpuLease:
    """The exclusive lease of the GPU with NVML UUID ``uuid`` (NVML index ``gpu_index``, for messages).

    A context manager: entry takes it (:meth:`acquire`), exit releases it (:meth:`release`), on every path.
    A lease held by a live process raises :class:`LeaseHeldError` (one line: the GPU, the holder, ``fix``)
    unless ``force``, where it goes on without the lease after a ``note``. A stale lease (a record under a free
    lock: its holder died) is taken over after a ``note`` naming the dead holder. ``directory``: default
    :func:`lease_directory`. ``note`` receives one line for stderr. ``record``: the holder the lease file names
    (default: this process; ``kdvfs daemon`` names the client it holds the lease for).
    """

    def __init__(self, uuid: str, gpu_index: int, *, directory: Path | None = None, force: bool = False,
                 fix: str = CLAIM_FIX, note: Callable[[str], None] = _note, record: LeaseHolder | None = None
                 ) -> None:
        self.uuid, self.gpu_index = uuid, gpu_index
        self._default_directory = directory is None
        self.directory = lease_directory() if directory is None else directory
        self.path = self.directory / f"{uuid}.lease"
        self._force, self._fix, self._note, self._record = force, fix, note, record
        self.fd: int | None = None
        self.previous: LeaseHolder | None = None
        """The stale holder taken over, or the live one overridden with ``force``."""

    def holder(self) -> LeaseHolder | None:
        """The holder this lease's file records now (None: none recorded)."""
        try:
            return LeaseHolder.parse(self.path.read_text(encoding="utf-8"))
        except OSError:
            return None

    def acquire(self) -> Self:
        """Take the lease (see the class docstring); idempotent while held."""
        if self.fd is not None:
            return self
        _make_directory(self.directory, shared=self._default_directory)
        fd = _open_lease_file(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            self._held_elsewhere()
            return self
        self.previous = LeaseHolder.parse(_read_record(fd))
        if self.previous is not None:
            self._note(f"GPU {self.uuid} (index {self.gpu_index}): taking over the stale lease of "
                       f"{self.previous.described()}, which ended without releasing it")
        self.fd = fd
        self._write(json.dumps(asdict(self._record or LeaseHolder.this_process(self.gpu_index))))
        return self

    def _held_elsewhere(self) -> None:
        holder = self.holder()
        who = "another process (no record yet)" if holder is None else holder.described()
        pid = "PID" if holder is None else str(holder.pid)
        if not self._force:
            raise LeaseHeldError(f"GPU {self.uuid} (index {self.gpu_index}) is leased by {who}; "
                                 f"{self._fix.format(pid=pid)}")
        self.previous = holder
        self._note(f"GPU {self.uuid} (index {self.gpu_index}) is leased by {who}; going on without the lease "
                   "(--force)")

    def _write(self, text: str) -> None:
        assert self.fd is not None
        with contextlib.suppress(OSError):  # a read-only descriptor: the record stays as it was
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

    Raises :class:`LeaseHeldError` when a live process holds the lease, unless ``force`` (then it resets
    under it, with a note); a stale lease is taken over with a note. Raises
    :class:`~kdvfs.runtime.device.errors.ClockRestoreError` when the reset failed.
    """
    with GpuLease(read_gpu_uuid(index, nvml), index, force=force, fix=RESET_FIX):
        return reset_gpu_clocks(index, nvml)
