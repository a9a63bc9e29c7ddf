"""The provenance block and results files shared by the benchmark scripts (``benchmarks/common/provenance.py``)."""

from __future__ import annotations

import json
import sys
import types
from datetime import datetime
from pathlib import Path

import pytest

from benchmarks.common.provenance import PROVENANCE_KEYS, host, provenance, provenance_lines, utc_now, write_results
from kdvfs.common.run_record import git_revision


def test_provenance_has_the_keys_results_files_carry() -> None:
    record = provenance("python -m benchmarks.model.example", figure="what it measures")
    assert tuple(record) == PROVENANCE_KEYS == ("figure", "command", "machine", "python", "date_utc", "git_revision")
    assert record["figure"] == "what it measures"
    assert record["command"] == "python -m benchmarks.model.example"
    assert all(isinstance(v, str) for v in record.values())
    assert record["machine"].startswith(host()["machine"] + " (") and record["machine"].endswith(" cores)")
    assert record["python"].count(".") == 2 and record["git_revision"] == git_revision()
    assert datetime.fromisoformat(record["date_utc"]).utcoffset() is not None


def test_markdown_lines_of_a_block_or_a_document() -> None:
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
