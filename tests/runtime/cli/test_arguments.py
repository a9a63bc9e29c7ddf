"""Shared CLI arguments: budgets as checked fractions, output paths checked before any work, flag aliases."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest

from kdvfs.common.errors import KdvfsError
from kdvfs.runtime.cli import build_parser
from kdvfs.runtime.cli.arguments import budget, budget_list, check_output_file, check_output_folder


@pytest.mark.parametrize(("text", "value"), [("0", 0.0), ("0.01", 0.01), ("0.5", 0.5), ("1e-3", 0.001)])
def test_budgets_are_fractions(text: str, value: float) -> None:
    assert budget(text) == value


@pytest.mark.parametrize(("text", "message"), [
    ("5", "500% slowdown.*did you mean 0.05\\?"),
    ("1", "did you mean 0.01\\?"),
    ("inf", "finite fraction"),
    ("nan", "finite fraction"),
    ("-0.01", ">= 0"),
    ("1%", "not a number"),
])
def test_bad_budgets_are_refused(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        budget(text)


def test_budget_lists() -> None:
    assert budget_list("0,0.01,0.05") == [0.0, 0.01, 0.05]
    for text in (",", "0.01,5", "0.01,nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            budget_list(text)


def test_an_output_that_is_a_folder_or_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(KdvfsError, match="is a folder; give the output a file name"):
        check_output_file(tmp_path)
    with pytest.raises(KdvfsError, match=r"file\.txt is not a folder"):
        check_output_file(tmp_path / "file.txt" / "out.json")
    with pytest.raises(KdvfsError, match="is a file; give a folder"):
        check_output_folder(tmp_path / "file.txt")
    check_output_file(tmp_path / "new" / "deeper" / "out.json")
    check_output_folder(tmp_path / "new" / "run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_an_unwritable_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path and real_access(path, mode))
    with pytest.raises(KdvfsError, match=f"the folder {re.escape(str(tmp_path))} is not writable"):
        check_output_file(tmp_path / "out.json")
    with pytest.raises(KdvfsError, match="is not writable"):
        check_output_folder(tmp_path / "run")


def test_an_output_that_is_an_input_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "a.json.gz"
    source.write_text("x")
    with pytest.raises(KdvfsError, match="is also an input"):
        check_output_file(tmp_path / "." / "a.json.gz", [None, tmp_path / "other", source])
    check_output_file(tmp_path / "b.json.gz", [source])


@pytest.mark.parametrize(("argv", "dest", "value"), [
    (["plan", "--trace", "t", "--gpu", "g", "--method", "ilp", "--slowdown", "0.02"], "budget", 0.02),
    (["compare", "--trace", "t", "--gpu", "g", "--slowdown", "0.02"], "budget", [0.02]),
    (["evaluate", "--policy", "p", "--trace", "t", "--gpu", "g", "--slowdown", "0.02"], "budget", [0.02]),
    (["run", "--policy", "p", "--trace", "t", "--slowdown", "0.02"], "budget", 0.02),
    (["gpus", "local", "--gpu-index", "3"], "index", 3),
    (["gpus", "local", "--index", "3"], "index", 3),
    (["train", "--gpu", "h200", "-o", "runs/x"], "out", Path("runs/x")),
    (["demo", "--output", "runs/x"], "out", Path("runs/x")),
    (["plan", "--trace", "t", "--gpu", "g", "--method", "ilp", "--slowdown", "0", "--out", "p.json"], "output",
     Path("p.json")),
])
def test_flag_aliases(argv: list[str], dest: str, value: object) -> None:
    assert getattr(build_parser().parse_args(argv), dest) == value
