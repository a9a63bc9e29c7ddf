"""``benchmarks/h200/wake_cost.py``: the per-case figures from a run's trials, and a short run on the CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.h200.wake_cost import CASES, main, summarise


def _log(alone: list[float], helped: float, wakes: int) -> dict[str, Any]:
    trials: list[dict[str, Any]] = []
    for round_, rate in enumerate(alone):
        trials.append({"round": round_, "helper": None, "period_ms": 0.0, "work_us": 0.0, "seconds": 6.0,
                       "launches_per_s": rate})
        for helper, period_ms, work_us in CASES:
            trials.append({"round": round_, "helper": helper, "period_ms": period_ms, "work_us": work_us,
                           "seconds": 6.0, "launches_per_s": helped, "wakes": wakes, "helper_cpu_us_per_wake": 40.0})
    return {"trials": trials}


def test_the_training_threads_loss_is_against_its_runs_alone_in_the_same_round() -> None:
    rows = summarise(_log([1000.0, 1000.0], 800.0, 600))
    assert len(rows) == len(CASES)
    for row in rows:
        assert row["training_slowdown_pct"] == pytest.approx(25.0)
        assert row["training_lost_us_per_wake"] == pytest.approx(0.25 * 6.0 / 600 * 1e6)
        assert row["helper_cpu_us_per_wake"] == 40.0


def test_a_helper_that_costs_nothing_loses_nothing() -> None:
    rows = summarise(_log([1000.0, 1200.0], 1000.0, 600))
    assert rows[0]["slowdowns_pct"] == pytest.approx([0.0, 20.0])


def test_a_short_run_on_the_cpu_reports_every_case(tmp_path: Path) -> None:
    log = tmp_path / "run.json"
    assert main(["run", str(log), "--seconds", "0.3", "--rounds", "1", "--cpu"]) == 0
    trials = json.loads(log.read_text())["trials"]
    assert {(t["helper"], t["period_ms"], t["work_us"]) for t in trials if t["helper"]} == set(CASES)
    assert all(t["launches_per_s"] > 0 for t in trials)
