"""Compiled functions' cache follows the code: after a change in a function another one calls from a different
module, the caller is recompiled (numba's own cache keeps the old machine code, keyed on the caller's file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numba
import pytest

from kdvfs.common.compiled import PACKAGES, source_digest, use_cache_for

CALLER = """
import sys
from pathlib import Path
if sys.argv[1] == "versioned":
    from kdvfs.common.compiled import use_cache_for
    use_cache_for((Path(__file__).parent,))
import numba
import pytest
from callee import value

@numba.njit(cache=True)
def caller():
    return value()
"""
CALLEE = "import numba\n\n\n@numba.njit(cache=True)\ndef value():\n    return {}\n"


def _run(folder: Path, mode: str, cache: Path) -> int:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"} | {"XDG_CACHE_HOME": str(cache)}
    if mode == "plain":
        env["NUMBA_CACHE_DIR"] = str(cache / "plain")
    result = subprocess.run([sys.executable, "-c", f"import sys; sys.argv[1:] = ['{mode}']; import caller; "
                             "print(caller.caller())"], cwd=folder, env=env, capture_output=True, text=True,
                            check=True)
    return int(result.stdout.split()[-1])


def test_a_change_in_a_called_module_recompiles_the_caller(tmp_path: Path) -> None:
    folder, cache = tmp_path / "code", tmp_path / "cache"
    folder.mkdir()
    (folder / "caller.py").write_text(CALLER)
    (folder / "callee.py").write_text(CALLEE.format(1))
    assert _run(folder, "plain", cache) == 1 and _run(folder, "versioned", cache) == 1
    (folder / "callee.py").write_text(CALLEE.format(2))
    assert _run(folder, "plain", cache) == 1  # numba alone: the caller's stale machine code
    assert _run(folder, "versioned", cache) == 2


def test_the_folder_is_named_for_the_sources_and_a_user_choice_wins(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    before = source_digest((tmp_path,))
    (tmp_path / "a.py").write_text("x = 2\n")
    assert source_digest((tmp_path,)) != before
    monkeypatch.setattr(numba.config, "CACHE_DIR", numba.config.CACHE_DIR)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    assert use_cache_for((tmp_path,)) is None
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    folder = use_cache_for(PACKAGES)
    assert folder == tmp_path / "xdg" / "kdvfs" / "numba" / source_digest(PACKAGES) and folder.is_dir()
    assert str(folder) == numba.config.CACHE_DIR


def test_only_the_background_kind_releases_the_interpreter_lock() -> None:
    """``compiled_without_gil`` runs without the lock (a background thread's long work); ``compiled`` keeps it (a
    decision that released it may wait a switch interval to take it back)."""
    from kdvfs.common.compiled import compiled, compiled_without_gil

    def twice(x: float) -> float:
        return 2.0 * x

    assert compiled_without_gil(twice).targetoptions.get("nogil") is True
    assert not compiled(twice).targetoptions.get("nogil", False)
