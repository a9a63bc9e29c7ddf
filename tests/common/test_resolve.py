"""A bundled name or a path: existing files win, bundled names resolve, misses are typed errors that list names."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdvfs.common.errors import DataMissingError, ProfileError, TraceFormatError
from kdvfs.common.resolve import resolve_shipped, shipped_names


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    shipped = tmp_path / "shipped"
    (shipped / "h200").mkdir(parents=True)
    for name in ("a.yaml", "b.yaml", "h200/c.yaml", "notes.txt"):
        (shipped / name).write_text("x")
    return shipped


def test_names_are_relative_paths_without_the_suffix(folder: Path) -> None:
    assert shipped_names(folder, ".yaml") == ["a", "b", "h200/c"]


@pytest.mark.parametrize("where", ["missing", "h200"])
def test_a_folder_without_shipped_files_is_a_broken_installation(folder: Path, where: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KDVFS_HOME", raising=False)
    with pytest.raises(DataMissingError, match=r"no \*\.json files \(kdvfs is installed without its data\)"):
        shipped_names(folder / where, ".json")
    monkeypatch.setenv("KDVFS_HOME", "/elsewhere")
    with pytest.raises(DataMissingError, match="KDVFS_HOME=/elsewhere lacks them"):
        resolve_shipped("h300", folder / where, ".json", "trace", error=TraceFormatError)


def test_files_and_bundled_names_resolve(folder: Path, tmp_path: Path) -> None:
    own = tmp_path / "mine"
    own.write_text("x")
    assert resolve_shipped(own, folder, ".yaml", "GPU profile", error=ProfileError) == own
    assert resolve_shipped("h200/c", folder, ".yaml", "GPU profile", error=ProfileError) == folder / "h200/c.yaml"
    assert resolve_shipped("a", folder, ".yaml", "GPU profile", error=ProfileError) == folder / "a.yaml"


def test_a_missing_file_is_named(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"nothing\.json: no such trace file$"):
        resolve_shipped(tmp_path / "nothing.json", folder, ".yaml", "trace", error=TraceFormatError)


def test_an_unknown_name_lists_the_bundled_ones(folder: Path) -> None:
    with pytest.raises(ProfileError) as caught:
        resolve_shipped("h300", folder, ".yaml", "GPU profile", error=ProfileError, name_kind="GPU", hint=" (or ask)")
    assert str(caught.value) == (f"unknown GPU 'h300'; known: a, b, h200/c (bundled: {folder}/<name>.yaml); "
                                 "or pass a GPU profile file (or ask)")


def test_a_folder_is_named_as_one_with_the_files_it_holds(folder: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    with pytest.raises(TraceFormatError, match=r"runs is a folder, expected a trace file or a bundled name$"):
        resolve_shipped(runs, folder, ".json", "trace", error=TraceFormatError)
    (runs / "step.json").write_text("{}")
    with pytest.raises(TraceFormatError, match=r"; it holds .*runs/step\.json$"):
        resolve_shipped(runs, folder, ".json", "trace", error=TraceFormatError)
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path)  # a folder named like a bundled file does not hide it
    assert resolve_shipped("a", folder, ".yaml", "GPU profile", error=ProfileError) == folder / "a.yaml"
