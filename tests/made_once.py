"""Expensive session setup made once per test session, however many pytest-xdist workers ask for it."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder ``name`` filled by ``make(folder)`` once in this session: under pytest-xdist in the session's
    temporary folder that every worker shares, the first worker to ask making it while the others wait on a lock;
    else in this process's own. Tests read what is there and write elsewhere. A ``make`` that raises leaves no
    folder (the next worker to ask tries again, and fails the same way)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # each worker's own folder is one below the session's
    folder, done = root / name, root / f"{name}.done"
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            try:
                make(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            done.touch()
    return folder
