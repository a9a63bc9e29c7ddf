"""Atomic writes: a failure never leaves a half-written file behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kdvfs.common.files import read_text, write_text_atomic


def test_write_and_read_plain_and_gzip(tmp_path: Path) -> None:
    for name in ("a.json", "a.json.gz"):
        write_text_atomic(tmp_path / name, "héllo\n")
        assert read_text(tmp_path / name) == "héllo\n"
    assert (tmp_path / "a.json.gz").read_bytes()[:2] == b"\x1f\x8b"


def test_failure_mid_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.json"
    path.write_text("old")

    def fail(_: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]


def test_new_files_get_normal_permissions(tmp_path: Path) -> None:
    write_text_atomic(tmp_path / "x.txt", "x")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "x.txt").stat().st_mode & 0o777 == 0o666 & ~umask
