"""Compiled (numba) functions with an on-disk cache that follows the code: ``compiled`` is ``numba.njit`` with
``cache=True``, its cache in a folder named for a digest of kdvfs's sources (every ``.py`` of its packages).

numba keys a cached function on its own file's time stamp only: a change in a function it calls from another
module leaves the old machine code in use (a stale ``decide_live`` after an edit to ``live_tables.py`` returned
wrong clock pairs). Here any change in the sources is a new folder, so stale code is never loaded.
The folder is ``$XDG_CACHE_HOME/kdvfs/numba/<digest>`` (``~/.cache`` without it); ``NUMBA_CACHE_DIR``, when
set, is the user's choice and is left alone. A folder that cannot be created leaves numba's default in place.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba

_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = tuple(_ROOT / name for name in ("common", "envs", "agents", "runtime"))
"""The kdvfs packages' folders (in a clone and installed alike)."""


def source_digest(folders: tuple[Path, ...]) -> str:
    """A digest (16 hex digits) of every ``.py`` file's path and content under ``folders``."""
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            digest.update(f"{folder.name}/{path.relative_to(folder)}".encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def use_cache_for(folders: tuple[Path, ...]) -> Path | None:
    """Point numba's cache at the folder for the sources under ``folders`` (see above); that folder, or None
    when ``NUMBA_CACHE_DIR`` was set or it cannot be made. Must run before the functions are decorated."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = base / "kdvfs" / "numba" / source_digest(folders)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    numba.config.CACHE_DIR = str(folder)  # type: ignore[attr-defined]
    return folder


@functools.cache
def _package_cache() -> Path | None:
    """The cache folder of kdvfs's current sources, chosen once per process (:func:`use_cache_for`)."""
    return use_cache_for(PACKAGES)


def compiled(function: Callable[..., Any]) -> Any:
    """``numba.njit(cache=True)`` with the cache folder of kdvfs's current sources."""
    _package_cache()
    return numba.njit(cache=True)(function)


def compiled_without_gil(function: Callable[..., Any]) -> Any:
    """:func:`compiled`, releasing the interpreter lock while it runs (``nogil``): for long work on a background
    thread, which then does not hold up the training loop. Not for the controller's decisions: a thread that
    released the lock may wait a switch interval (5 ms) to take it back."""
    _package_cache()
    return numba.njit(cache=True, nogil=True)(function)
