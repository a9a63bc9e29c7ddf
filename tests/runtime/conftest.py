"""Runtime fixtures: the fake NVML, reset. The test doubles themselves are ``kdvfs.runtime.testing``."""

from __future__ import annotations

import pytest

from kdvfs.runtime.testing import nvml as shared_fake_nvml
from kdvfs.runtime.testing.fake_nvml import EnergyFakeNvml


@pytest.fixture
def shared_nvml() -> EnergyFakeNvml:
    """The fake NVML that ``--nvml-module kdvfs.runtime.testing.nvml`` imports in this process, reset."""
    return shared_fake_nvml.fresh()
