"""File helpers shared by every writer and reader: atomic writes, transparent gzip and data-file names."""

from __future__ import annotations

import gzip
import os
import re
import tempfile
from pathlib import Path


def _default_mode() -> int:
    """Permissions a newly created file gets under the current umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (gzip-compressed when it ends in ``.gz``) via a temp file and rename.

    A crash or error leaves either the old file or none, never a half-written one.
    """
    data = text.encode("utf-8")
    write_bytes_atomic(path, gzip.compress(data, mtime=0) if Path(path).suffix == ".gz" else data)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp_name, path.stat().st_mode & 0o777 if path.exists() else _default_mode())
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def read_text(path: Path) -> str:
    """Read a UTF-8 text file, gunzipping it when it starts with the gzip magic bytes.

    Raises:
        OSError: the file cannot be read.
        gzip.BadGzipFile, EOFError: truncated or corrupt gzip data.
        UnicodeDecodeError: not text.
    """
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return raw.decode("utf-8")


def read_input(path: Path, error: type[Exception], missing_hint: str = "check the path") -> str:
    """Read a user-supplied text file (gzip allowed); a missing, unreadable or damaged file, or a folder, raises
    ``error`` with a one-line message naming the file and the fix."""
    try:
        return read_text(Path(path))
    except FileNotFoundError:
        raise error(f"{path}: no such file; {missing_hint}") from None
    except IsADirectoryError:
        raise error(f"{path} is a folder, expected a file; {missing_hint}") from None
    except (OSError, EOFError, UnicodeDecodeError) as reason:
        raise error(f"{path}: cannot be read ({reason}); the file is corrupt or truncated") from None


_DATA_SUFFIX = re.compile(r"(\.trace)?\.json(\.gz)?$")


def split_suffix(name: str) -> tuple[str, str]:
    """A file name split before its data suffix: ``step.trace.json.gz`` -> (``step``, ``.trace.json.gz``),
    ``run.jsonl`` -> (``run``, ``.jsonl``), ``tb`` -> (``tb``, ``""``)."""
    match = _DATA_SUFFIX.search(name)
    if match:
        return name[:match.start()], match.group()
    path = Path(name)
    return path.stem, path.suffix
