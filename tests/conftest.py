"""Shared pytest setup: ``gpu``-marked tests are skipped automatically where NVML cannot start, and tests share
helpers as ``tests.*`` modules (``tests.runtime.controller_helpers``), the repository root importable however
pytest was started."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pynvml
import pytest

from kdvfs.common.paths import REPO_ROOT

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@functools.cache
def _nvml_starts() -> bool:
    """True when NVML initialises on this machine (an NVIDIA driver and GPU are present)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.fixture(autouse=True)
def lease_directory(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A GPU lease directory of the test's own (``KDVFS_LEASE_DIR``, inherited by its child processes), so
    that tests never meet each other's leases, nor a real one of this machine."""
    directory = tmp_path_factory.mktemp("leases")
    monkeypatch.setenv("KDVFS_LEASE_DIR", str(directory))
    return directory


@pytest.fixture(scope="session")
def nvml_available() -> bool:
    """Whether real NVML works here, for tests that behave differently with and without a GPU."""
    return _nvml_starts()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and not _nvml_starts():
        skip = pytest.mark.skip(reason="needs a real NVIDIA GPU: NVML does not initialise here")
        for item in gpu_items:
            item.add_marker(skip)
