"""The provenance block and results files shared by the benchmark scripts (``benchmarks/common/provenance.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from datetime import datetime
from pathlib import Path

import pytest

import benchmarks.common.provenance as module
from benchmarks.common.provenance import PROVENANCE_KEYS, host, provenance, provenance_lines, utc_now, write_results
from kdvfs.common.errors import UnknownGpuError
from kdvfs.common.run_record import git_revision


def test_provenance_has_the_keys_results_files_carry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "git_revision", lambda: "0123abc")  # a clean tree
    record = provenance("python -m benchmarks.model.example", figure="what it measures")
    assert tuple(record) == PROVENANCE_KEYS == ("figure", "command", "machine", "python", "date_utc", "git_revision")
    assert record["figure"] == "what it measures"
    assert record["command"] == "python -m benchmarks.model.example"
    assert all(isinstance(v, str) for v in record.values())
    assert record["machine"].startswith(host()["machine"] + " (") and record["machine"].endswith(" cores)")
    assert record["python"].count(".") == 2 and record["git_revision"] == "0123abc"
    assert datetime.fromisoformat(record["date_utc"]).utcoffset() is not None


def test_a_dirty_tree_records_its_diff_in_the_json_and_names_it_on_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """A results file written from uncommitted changes keeps them: its revision alone would not rebuild the code."""
    monkeypatch.setattr(module, "git_revision", lambda: "0123abc+dirty")
    monkeypatch.setattr(module, "tracked_diff", lambda: "diff --git a/x b/x\n+y\n")
    record = provenance("c", figure="f")
    assert tuple(record) == (*PROVENANCE_KEYS, "git_diff") and record["git_diff"] == "diff --git a/x b/x\n+y\n"
    assert provenance_lines(record)[-1] == ("- git_diff: the tracked changes at the run (2 lines of `git diff HEAD`), "
                                            "in the JSON file's `git_diff`")


def test_markdown_lines_of_a_block_or_a_document(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "git_revision", lambda: "0123abc")
    record = provenance("c", figure="f")
    lines = provenance_lines({**record, "other": 1})
    assert lines == ["- figure: f", *(f"- {key}: `{record[key]}`" for key in PROVENANCE_KEYS[1:])]
    assert lines[1] == "- command: `c`"
    assert provenance_lines({key: record[key] for key in PROVENANCE_KEYS[1:]})[0] == "- command: `c`"


def test_the_figure_defaults_to_the_first_line_of_the_running_scripts_docstring(
        monkeypatch: pytest.MonkeyPatch) -> None:
    script = types.ModuleType("__main__", "The thing it measures.\n\n    python -m benchmarks.model.x\n")
    monkeypatch.setitem(sys.modules, "__main__", script)
    assert provenance("c")["figure"] == "The thing it measures (claim list: `docs/results.md`)"


def test_host_record_and_time() -> None:
    assert set(host()) == {"machine", "python"}
    assert len(utc_now()) == len("2026-11-29T20:00:51+00:00")


def test_write_results(tmp_path: Path) -> None:
    result = {"provenance": provenance("c"), "figures": [1, 2]}
    write_results("bench", result, "# Bench\n", folder=tmp_path / "out")
    assert (tmp_path / "out" / "bench.json").read_text() == json.dumps(result, indent=2) + "\n"
    assert (tmp_path / "out" / "bench.md").read_text() == "# Bench\n"
    write_results("only_json", result, indent=1, folder=tmp_path)
    assert json.loads((tmp_path / "only_json.json").read_text()) == result
    assert not (tmp_path / "only_json.md").exists()


@pytest.mark.parametrize(("smi_name", "profile"), [("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H200", "h200")])
def test_local_profile_is_the_shipped_profile_listing_the_gpu(monkeypatch: pytest.MonkeyPatch, smi_name: str,
                                                              profile: str) -> None:
    printed = subprocess.CompletedProcess([], 0, stdout=f"{smi_name}\n{smi_name}\n", stderr="")
    monkeypatch.setattr(module.subprocess, "run", lambda *args, **kwargs: printed)
    assert module.local_profile() == profile
    assert module.local_profile(cpu_test=True) == "h200"


def test_local_profile_of_an_unknown_gpu_says_how_to_make_one(monkeypatch: pytest.MonkeyPatch) -> None:
    printed = subprocess.CompletedProcess([], 0, stdout="NVIDIA Imaginary 1\n", stderr="")
    monkeypatch.setattr(module.subprocess, "run", lambda *args, **kwargs: printed)
    with pytest.raises(UnknownGpuError, match="kdvfs gpus local --write"):
        module.local_profile()


def test_the_revision_is_the_checkouts() -> None:
    record = provenance("c", figure="f")
    assert record["git_revision"] == git_revision() and ("git_diff" in record) == git_revision().endswith("+dirty")
