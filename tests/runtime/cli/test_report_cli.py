"""``kdvfs report`` on real logs' shapes (issue 50): a killed run's log whose last record is cut off is read with
one warning, a damaged record elsewhere is an error naming the file and line, ``--json`` prints the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kdvfs.runtime.cli import main
from kdvfs.runtime.controller.model.run_summary import Measured
from kdvfs.runtime.controller.training.ended import SoFar, measured_so_far
from tests.schema_check import strict_loads, validate

MEASURED = {"energy_saved_pct": 2.0, "energy_saved_ci95_pct": [1.0, 3.0], "slowdown_pct": 0.5,
            "slowdown_ci95_pct": [0.1, 0.9], "windows_auto": 2, "windows_controlled": 2}


def _window(pair: int, arm: str) -> dict[str, Any]:
    last = 20 * pair + (9 if arm == "A" else 19)
    return {"event": "window", "first_step": last - 9, "last_step": last, "arm": arm, "pair": pair, "steps": 10,
            "step_time_s": 0.1 if arm == "A" else 0.1005, "start_s": float(last), "end_s": last + 1.0,
            "controlled_steps": 0 if arm == "A" else 10}


def _records() -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for pair in range(2):
        records += [_window(pair, "A"), _window(pair, "B"),
                    {"event": "pair", "step": 20 * pair + 19, "measured": MEASURED}]
    return records


def _log(tmp_path: Path, tail: str = "") -> Path:
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in _records()) + tail)
    return log


CUT = json.dumps(_window(2, "A"))[:40]  # a kill in the middle of writing a record: no newline after it


def test_a_cut_off_last_record_is_ignored_with_one_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _log(tmp_path, CUT)
    assert main(["report", str(log)]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("last record cut off, ignored") == 1 and str(log) in captured.err, captured.err
    assert "+2.00% [+1.00, +3.00]" in captured.out


def test_a_damaged_record_elsewhere_names_the_file_and_line(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    lines = _log(tmp_path).read_text().splitlines(keepends=True)
    lines[2] = lines[2][:30] + "\n"
    log = tmp_path / "run.jsonl"
    log.write_text("".join(lines))
    assert main(["report", str(log)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{log}: line 3, column" in err, err
    log.write_text("".join(lines[:2]) + "[1, 2]\n")
    assert main(["report", str(log)]) == 2
    assert f"{log}: line 3: not a kdvfs run log record" in capsys.readouterr().err


def test_report_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _log(tmp_path, CUT)
    assert main(["report", str(log), "--json"]) == 0
    captured = capsys.readouterr()
    report = strict_loads(captured.out)
    validate(report, "report")
    assert report["log"] == str(log) and report["last_record_cut_off"] is True
    assert report["arms"]["auto"] == {"windows": 2, "step_time_s": pytest.approx(0.1), "energy_j_per_step": None}
    assert report["arms"]["controlled"]["windows"] == 2 and report["measured"] == MEASURED
    assert report["no_measurement_reason"] is None and report["predicted"] is None
    assert "last record cut off" in captured.err
    assert main(["report", str(tmp_path / "absent.jsonl"), "--json"]) == 2
    assert "no such file" in json.loads(capsys.readouterr().out)["error"]


def test_a_killed_runs_summary_counts_the_windows_before_the_cut(tmp_path: Path) -> None:
    log = _log(tmp_path, CUT)
    assert measured_so_far(str(log), [0], distributed=False) == SoFar(39, 4, Measured.from_json(MEASURED))
