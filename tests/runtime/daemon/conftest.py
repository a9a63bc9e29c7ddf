"""Daemon test fixtures: a folder every user may enter, and a running daemon on the fake NVML there."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime.daemon.daemon_helpers import RunningDaemon, start_daemon


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A fresh folder under /tmp that every user may enter and write (an unprivileged client runs there)."""
    folder = Path(tempfile.mkdtemp(prefix="kdvfs-daemon-test-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)



@pytest.fixture
def daemon(open_folder: Path) -> Iterator[RunningDaemon]:
    """A running daemon serving both fake GPUs; stopped (SIGTERM) after the test."""
    running = start_daemon(open_folder)
    yield running
    if running.process.poll() is None:
        running.stop()
