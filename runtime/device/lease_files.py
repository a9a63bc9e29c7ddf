"""Where GPU leases live and how their files are opened and read: the lease directory, a lease file (never
through a symbolic link, never one another user could write), its bounded read, the directory lock that orders
take-overs, and the identity of the process that holds a lease (pid and start time, from ``/proc``).

The lease directory (:func:`lease_directory`): ``KDVFS_LEASE_DIR`` when set; else, for root,
``/run/kdvfs`` (the daemon's too, under systemd its ``RuntimeDirectory``); else, for any other user, a
directory of that user's own, ``$XDG_RUNTIME_DIR/kdvfs`` or ``/tmp/kdvfs-UID``. :func:`prepare_directory`
creates it (``0755`` for ``/run/kdvfs``, ``0700`` otherwise) and refuses one that is a symbolic link, is owned
by another user or is writable by others (one it owns it narrows to its mode, e.g. an old ``1777``). Lease
files are created mode ``0640`` by the directory's owner; a file there that another user owns, or that others
may write, is replaced before use, so no record in it can come from someone else.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from kdvfs.runtime.device.errors import DeviceError

LEASE_DIR_VARIABLE = "KDVFS_LEASE_DIR"
SYSTEM_DIRECTORY = Path("/run/kdvfs")
SYSTEM_DIRECTORY_MODE = 0o755
USER_DIRECTORY_MODE = 0o700
LEASE_FILE_MODE = 0o640
MAX_RECORD_BYTES = 4096
"""The most of a lease file read (a record is well under 1 KiB); a longer file is corrupt, so stale."""
DIRECTORY_LOCK = ".lock"
DIRECTORY_LOCK_WAIT_S = 2.0
_POLL_S = 0.01
_START_FIELD = 19
"""Index of ``starttime`` (field 22 of ``/proc/PID/stat``) among the fields after the command's ``)``."""


class LeaseDirectoryError(DeviceError):
    """The lease directory or a lease file cannot be created, opened or trusted."""


def lease_directory(environ: Mapping[str, str] = os.environ, euid: int | None = None) -> Path:
    """Where GPU leases live for a process of effective uid ``euid`` (default this one's; module docstring)."""
    if environ.get(LEASE_DIR_VARIABLE):
        return Path(environ[LEASE_DIR_VARIABLE])
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return SYSTEM_DIRECTORY
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and _owned_by(Path(runtime), euid):
        return Path(runtime) / "kdvfs"
    return Path(f"/tmp/kdvfs-{euid}")


def _owned_by(path: Path, uid: int) -> bool:
    try:
        found = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == uid


def _where_fix(directory: Path) -> str:
    return (f"remove it (`sudo rm -rf {directory}`) so kdvfs creates it, or set {LEASE_DIR_VARIABLE} to a directory "
            "of your own that others cannot write")


def prepare_directory(directory: Path) -> None:
    """Create ``directory`` (mode per the module docstring) or check the existing one: a real directory, owned
    by this user, writable by nobody else (narrowed to its mode when it is this user's); raises
    :class:`LeaseDirectoryError` in one line otherwise."""
    mode = SYSTEM_DIRECTORY_MODE if directory == SYSTEM_DIRECTORY else USER_DIRECTORY_MODE
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=mode)
            os.chmod(directory, mode)  # the umask may have narrowed it
        found = directory.lstat()
    except OSError as error:
        raise LeaseDirectoryError(f"cannot create the GPU lease directory {directory}: {error.strerror}; set "
                                  f"{LEASE_DIR_VARIABLE} to a directory of your own") from None
    if not stat.S_ISDIR(found.st_mode):
        raise LeaseDirectoryError(f"the GPU lease directory {directory} is not a directory (a symbolic link or a "
                                  f"file); {_where_fix(directory)}")
    if found.st_uid != os.geteuid():
        raise LeaseDirectoryError(f"the GPU lease directory {directory} belongs to uid {found.st_uid}, not to you "
                                  f"(uid {os.geteuid()}): its lease records could be anyone's; {_where_fix(directory)}")
    if found.st_mode & 0o022:
        try:
            os.chmod(directory, mode)  # e.g. the 1777 of an earlier kdvfs
        except OSError as error:
            raise LeaseDirectoryError(f"the GPU lease directory {directory} is writable by others and cannot be "
                                      f"narrowed ({error.strerror}); {_where_fix(directory)}") from None


def _symlink_error(path: Path) -> LeaseDirectoryError:
    return LeaseDirectoryError(f"the GPU lease file {path} is a symbolic link; kdvfs opens lease files only "
                               f"without following links (O_NOFOLLOW): remove it (`rm {path}`)")


def open_lease_file(path: Path) -> int:
    """A read-write descriptor of the lease file ``path`` (created mode 0640), close-on-exec. A symbolic link is
    refused; a file another user owns or others may write is replaced by a new one of this user's."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(3):
        if path.is_symlink():
            raise _symlink_error(path)
        try:
            fd = os.open(path, flags, LEASE_FILE_MODE)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise _symlink_error(path) from None
            raise LeaseDirectoryError(f"cannot open the GPU lease file {path}: {error.strerror}; "
                                      f"{_where_fix(path.parent)}") from None
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            os.close(fd)
            raise LeaseDirectoryError(f"the GPU lease file {path} is not a regular file; remove it (`rm {path}`)")
        if found.st_uid == os.geteuid() and not found.st_mode & 0o022:
            return fd
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # another user's (or a world-writable) record is no record: start a new file
    raise LeaseDirectoryError(f"the GPU lease file {path} keeps being replaced by another user; "
                              f"{_where_fix(path.parent)}")


def read_record(fd: int) -> tuple[str, bool]:
    """The text of the lease file open as ``fd`` (at most :data:`MAX_RECORD_BYTES`) and whether it was longer
    (then it is corrupt: no record is that long)."""
    data = os.pread(fd, MAX_RECORD_BYTES + 1, 0)
    return data[:MAX_RECORD_BYTES].decode("utf-8", "replace"), len(data) > MAX_RECORD_BYTES


def read_record_at(path: Path) -> tuple[str, bool]:
    """:func:`read_record` of the file at ``path`` (no link followed); ``("", False)`` when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return "", False
    try:
        return read_record(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """Hold ``directory``'s lock file (owner-only) while taking or breaking a lease there, so a take-over never
    removes a lease someone took in between; :class:`LeaseDirectoryError` after
    :data:`DIRECTORY_LOCK_WAIT_S` without it."""
    path = directory / DIRECTORY_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as error:
        raise LeaseDirectoryError(f"cannot open the lease directory's lock {path}: {error.strerror}; "
                                  f"{_where_fix(directory)}") from None
    try:
        deadline = time.monotonic() + DIRECTORY_LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LeaseDirectoryError(f"the lease directory's lock {path} stayed held for "
                                              f"{DIRECTORY_LOCK_WAIT_S:g} s (a kdvfs process stopped while taking a "
                                              "lease?); try again, or stop that process") from None
                time.sleep(_POLL_S)
        yield
    finally:
        os.close(fd)


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/PID/stat``), None when there is no such
    process. With the pid it names one process for the whole boot: a pid reused later starts later."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            text = stat_file.read(4096)
        return int(text[text.rindex(b")") + 2:].split()[_START_FIELD])
    except (OSError, ValueError, IndexError):
        return None


def process_uid(pid: int) -> int | None:
    """The uid owning process ``pid`` (its ``/proc`` entry), None when there is no such process."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def process_alive(pid: int, start_ticks: int | None, uid: int | None = None) -> bool:
    """True when process ``pid`` runs now, started at ``start_ticks`` and (when given) belongs to ``uid``."""
    if pid <= 0 or start_ticks is None or process_start_ticks(pid) != start_ticks:
        return False
    return uid is None or process_uid(pid) == uid
