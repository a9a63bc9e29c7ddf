"""The lock hand-over benchmark (``benchmarks/lock_handovers.py``) runs its three variants and writes its files."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.scripts import script_module


def test_it_measures_each_variant_and_writes_its_results(tmp_path: Path) -> None:
    lock_handovers = script_module("lock_handovers")
    assert lock_handovers.main(["--seconds", "0.2", "--rounds", "1", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "lock_handovers.json").read_text())["rows"]
    assert [row["variant"] for row in rows] == ["no pipe traffic", "os.write", "write_holding_lock"]
    assert all(row["points_per_s"] > 0 and row["main_loops_per_s"] > 0 for row in rows)
    assert "| write_holding_lock |" in (tmp_path / "lock_handovers.md").read_text()
