"""Runtime fixtures: the fake NVML, reset; a CPU capture of the tiny GPT and its plan. The test doubles themselves
are ``kdvfs.runtime.testing``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kdvfs.common.paths import REPO_ROOT
from kdvfs.runtime.testing import nvml as shared_fake_nvml
from kdvfs.runtime.testing.fake_nvml import EnergyFakeNvml
from tests.made_once import made_once


@pytest.fixture
def shared_nvml() -> EnergyFakeNvml:
    """The fake NVML that ``--nvml-module kdvfs.runtime.testing.nvml`` imports in this process, reset."""
    return shared_fake_nvml.fresh()


TINY_GPT = [sys.executable, str(REPO_ROOT / "examples" / "gpt.py"), "--size", "tiny", "--device", "cpu"]
KDVFS_CLI = [sys.executable, "-c", "import sys; from kdvfs.runtime.cli import main; sys.exit(main(sys.argv[1:]))"]


def _capture_and_plan(folder: Path) -> None:
    for argv in (["capture", "--cpu-test-mode", "--nvml-module", "kdvfs.runtime.testing.nvml", "--energy-window-s",
                  "0.3", "-o", str(folder / "cpu.trace.json"), "--", *TINY_GPT, "--steps", "1000"],
                 ["plan", "--trace", str(folder / "cpu.trace.json"), "--gpu", "h200", "--method", "static",
                  "--slowdown", "0.01", "-o", str(folder / "plan.json")]):
        done = subprocess.run([*KDVFS_CLI, *argv], capture_output=True, text=True, cwd=REPO_ROOT, check=False,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="session")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A CPU-test-mode capture of the tiny GPT (fake NVML) and its static plan at 1%: (trace, plan), made once
    per session (all pytest-xdist workers) through real ``kdvfs capture`` and ``kdvfs plan`` processes."""
    folder = made_once(tmp_path_factory, "capture", _capture_and_plan)
    return folder / "cpu.trace.json", folder / "plan.json"
