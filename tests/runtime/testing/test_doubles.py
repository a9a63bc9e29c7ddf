"""The test doubles of ``kdvfs.runtime.testing``: production code never imports them, and the fake NVML binding
importable by name logs its calls when asked."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kdvfs.common.paths import REPO_ROOT
from kdvfs.runtime.device.nvml_device import import_nvml, read_local_gpus
from kdvfs.runtime.testing import nvml as shared_fake_nvml
from kdvfs.runtime.testing.fake_nvml import READ_ONLY_CALL, EnergyFakeNvml

PRODUCTION = sorted(path for path in (REPO_ROOT / "runtime").rglob("*.py") if "testing" not in path.parts)


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    return modules | {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}


@pytest.mark.parametrize("path", PRODUCTION, ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_production_code_never_imports_the_test_doubles(path: Path) -> None:
    assert not {name for name in _imported_modules(path) if name.startswith("kdvfs.runtime.testing")}


def test_the_binding_named_on_the_command_line_is_the_shared_fake(shared_nvml: EnergyFakeNvml) -> None:
    binding = import_nvml("kdvfs.runtime.testing.nvml")
    (gpu,) = read_local_gpus(binding)
    assert gpu.name == "NVIDIA H200" and shared_nvml.state.calls[0] == "nvmlInit"
    assert all(READ_ONLY_CALL.fullmatch(name) for name in shared_nvml.state.calls)


def test_the_binding_logs_its_calls_when_asked(shared_nvml: EnergyFakeNvml, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "nvml.log"
    read_local_gpus(shared_fake_nvml)
    assert not log.exists()
    monkeypatch.setenv(shared_fake_nvml.LOG_VARIABLE, str(log))
    shared_nvml.state.calls.clear()
    read_local_gpus(shared_fake_nvml)
    assert log.read_text().split() == shared_nvml.state.calls
