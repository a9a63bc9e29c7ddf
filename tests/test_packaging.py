"""kdvfs installed from its wheel, as a user gets it: the wheel holds the shipped data, and in a fresh virtual
environment ``kdvfs demo`` runs from another folder. Nothing is downloaded: the wheel is built without build
isolation, installed with ``--no-deps``, and the fresh environment reuses this one's libraries (torch included)
through a ``.pth`` file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from kdvfs import __version__
from kdvfs.common.paths import HOME_VARIABLE, REPO_ROOT

SOURCES = ("pyproject.toml", "README.md", "kdvfs", "common", "envs", "agents", "runtime", "configs", "data", "policies")
SHIPPED = ("kdvfs/configs/gpus/h200.yaml", "kdvfs/configs/model_error.json", "kdvfs/configs/workloads/gpt2s.yaml",
           "kdvfs/configs/ppo/h200.yaml",
           "kdvfs/data/traces/h200/gpt3xl-24layer-b4.trace.json", "kdvfs/policies/h200.kdvfs-policy.npz",
           "kdvfs/data/raw/h200/ncu_gpt3xl_1layer.csv.gz", "kdvfs/runtime/cli/__init__.py",
           "kdvfs/common/paths.py")


def _run(*argv: str | Path, cwd: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in (HOME_VARIABLE, "PYTHONPATH")}
    result = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The kdvfs wheel, built from a copy of the sources (the checkout gets no build folder)."""
    root = tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        source, target = REPO_ROOT / name, root / "src" / name
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", root / "dist", root / "src")
    return next((root / "dist").glob("kdvfs-*.whl"))


def test_the_wheel_holds_the_shipped_data(wheel: Path) -> None:
    assert wheel.name.startswith(f"kdvfs-{__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(SHIPPED) <= names
    assert not any("__pycache__" in name or name.startswith(("tests/", "envs/")) for name in names)


def test_installed_from_the_wheel_the_demo_runs_from_another_folder(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    (site / "reuse-test-environment.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n")
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel)
    work = tmp_path / "elsewhere"
    work.mkdir()
    kdvfs = venv / "bin" / "kdvfs"
    assert _run(python, "-c", "import kdvfs; print(kdvfs.__file__)", cwd=work).startswith(str(site))
    assert "h200/gpt3xl-24layer-b4" in _run(kdvfs, "trace", "list", cwd=work).split()
    assert "rtx3080ti" in _run(kdvfs, "gpus", cwd=work)
    assert "30 kernels" in _run(kdvfs, "model", "validate", "--sweep", "gtx980", "--folds", "2", cwd=work)
    # Two sampled profiles: the ranges' path (the model's error read from the wheel) at a quarter of the default's
    # cost.
    out = _run(kdvfs, "demo", "--trace", "h200/gpt3xl-1layer-b4", "--samples", "2", "--out", "demo", cwd=work)
    assert "GPU profile h200" in out and "latency-optimal" in out and "no shipped policy" not in out
    assert (work / "demo" / "pareto.png").is_file() and (work / "demo" / "run.json").is_file()
