"""``benchmarks/h200/wake_cost.py``: the per-case figures from a run's blocks, and a short run on the CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.h200.wake_cost import CASES, main, summarise


def _log(rates: list[float], wakes: int, block_s: float = 0.25) -> dict[str, Any]:
    return {"trials": [{"helper": "python", "period_ms": 8.0, "work_us": 0.0, "block_s": block_s,
                        "launches_per_s": rates, "wakes": wakes, "helper_cpu_us_per_wake": 40.0}]}


def test_each_on_block_is_against_its_two_neighbouring_off_blocks() -> None:
    [row] = summarise(_log([1000.0, 800.0, 1000.0, 800.0, 1000.0], wakes=60))
    assert row["on_blocks"] == 2
    assert row["training_slowdown_pct"] == pytest.approx(25.0)
    assert row["training_slowdown_ci95_pct"] == pytest.approx([25.0, 25.0])
    # a fifth of each on-block's 0.25 s lost, over its 30 wakes
    assert row["training_lost_us_per_wake"] == pytest.approx(0.2 * 0.25 / 30 * 1e6)
    assert row["helper_cpu_us_per_wake"] == 40.0


def test_a_drift_linear_over_three_blocks_cancels() -> None:
    rates = [1000.0 + 10.0 * i for i in range(9)]
    [row] = summarise(_log(rates, wakes=120))
    assert row["training_slowdown_pct"] == pytest.approx(0.0, abs=1e-9)


def test_the_interval_widens_with_the_spread_of_the_on_blocks() -> None:
    [row] = summarise(_log([1000.0, 900.0, 1000.0, 800.0, 1000.0, 850.0, 1000.0, 900.0, 1000.0], wakes=120))
    lo, hi = row["training_slowdown_ci95_pct"]
    assert lo < row["training_slowdown_pct"] < hi
    assert lo > 0


def test_a_short_run_on_the_cpu_reports_every_case(tmp_path: Path) -> None:
    log = tmp_path / "run.json"
    assert main(["run", str(log), "--blocks", "5", "--block-s", "0.05", "--cpu"]) == 0
    trials = json.loads(log.read_text())["trials"]
    assert [(t["helper"], t["period_ms"], t["work_us"]) for t in trials] == list(CASES)
    assert all(len(t["launches_per_s"]) == 5 and min(t["launches_per_s"]) > 0 for t in trials)
    assert all(t["wakes"] > 0 for t in trials if t["helper"] != "none")
    assert all(t["wakes"] == 0 for t in trials if t["helper"] == "none")
    assert len(summarise(json.loads(log.read_text()))) == len(CASES)


def test_an_even_block_count_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["run", str(tmp_path / "run.json"), "--blocks", "6", "--cpu"])
    assert not (tmp_path / "run.json").exists()
