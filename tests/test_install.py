"""A fresh clone's first steps (issue 50): after `make demo` the user learns how to put `kdvfs` on PATH, the README
says which torch a GPU and a CPU-only machine get, and `make setup TORCH_INDEX=...` takes torch from that index
only when asked. `make -n` prints the recipes without running them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kdvfs.common.paths import REPO_ROOT

ACTIVATE = "source .venv/bin/activate"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _make_n(tmp_path: Path, *argv: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    venv = tmp_path / "venv"  # a venv that does not exist: every setup recipe is printed
    result = subprocess.run(["make", "-n", "-C", str(REPO_ROOT), f"VENV={venv}", *argv], capture_output=True,
                            text=True, check=True)
    return result.stdout


def _install_section() -> str:
    readme = (REPO_ROOT / "README.md").read_text()
    return readme[readme.index("## Install"):readme.index("\n## ", readme.index("## Install") + 1)]


def test_make_demo_says_how_to_put_kdvfs_on_path(tmp_path: Path) -> None:
    assert f"source {tmp_path / 'venv'}/bin/activate" in _make_n(tmp_path, "demo")
    assert ACTIVATE in _install_section()


def test_every_guide_that_runs_kdvfs_says_once_how_to_get_it_on_path() -> None:
    for page in sorted((REPO_ROOT / "docs" / "guide").glob("*.md")):
        text = page.read_text()
        if re.search(r"^kdvfs ", text, re.MULTILINE):
            assert text.count(ACTIVATE) == 1, page.name


def test_torch_comes_from_an_index_only_when_asked(tmp_path: Path) -> None:
    plain = _make_n(tmp_path, "setup")
    assert "--index-url" not in plain and "-c constraints.txt torch" in plain  # the pin, from pip's own indexes
    indexed = _make_n(tmp_path, "setup", f"TORCH_INDEX={CPU_INDEX}")
    assert f"--index-url {CPU_INDEX}" in indexed
    install = _install_section()
    assert f"pip install torch --index-url {CPU_INDEX}" in install and f"TORCH_INDEX={CPU_INDEX}" in install
    assert "CUDA build" in install and "pip install -e ." in install
