"""``benchmarks/h200/event_board.py``: a short run on the CPU (fake GPU events) and its report."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from benchmarks.h200 import event_board


def test_a_short_run_on_the_cpu_passes_every_item_in_order_and_reports(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_board, "IDLE_S", 0.2)
    log = tmp_path / "run.json"
    assert event_board.main(["run", str(log), "--steps", "5", "--anchors", "4", "--cpu"]) == 0
    run = json.loads(log.read_text())
    agreement = run["agreement"]
    assert agreement["ordered"] and agreement["anchors_seen"] == 5 * 4
    assert agreement["max_duration_error_ms"] is None  # no torch events on the CPU
    # the loop's own items, passed in stream order before each waited mark (not the warm-up loop's)
    assert agreement["anchors_passed"] == 5 * 4 and agreement["marks_passed"] == 5
    parts = run["hook_parts"]
    assert parts["current_stream_us"] is None and parts["allocations_us"] is None
    assert parts["anchor_us"] > 0 and parts["mark_us"] > 0
    assert run["poller_idle"]["idle_polls_per_s"] > 0
    monkeypatch.setattr(event_board, "write_results",
                        functools.partial(event_board.write_results, folder=tmp_path / "results"))
    assert event_board.main(["report", str(log), "--name", "board"]) == 0
    markdown = (tmp_path / "results" / "board.md").read_text()
    assert "5 steps" in markdown and "4 anchors each" in markdown


def test_bad_arguments_are_refused_before_anything_runs(tmp_path: Path) -> None:
    for arguments in (["--steps", "2"], ["--anchors", "0"], ["--anchors", "201"]):
        with pytest.raises(SystemExit):
            event_board.main(["run", str(tmp_path / "run.json"), "--cpu", *arguments])
    assert not (tmp_path / "run.json").exists()
