"""Runtime tests share helpers as ``tests.runtime.*`` modules (``controller_helpers``): make the repository root
importable however pytest was started. The test doubles themselves are ``kdvfs.runtime.testing``."""

from __future__ import annotations

import sys

import pytest

from kdvfs.envs.common.paths import REPO_ROOT
from kdvfs.runtime.testing import nvml as shared_fake_nvml
from kdvfs.runtime.testing.fake_nvml import EnergyFakeNvml

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@pytest.fixture
def shared_nvml() -> EnergyFakeNvml:
    """The fake NVML that ``--nvml-module kdvfs.runtime.testing.nvml`` imports in this process, reset."""
    return shared_fake_nvml.fresh()
