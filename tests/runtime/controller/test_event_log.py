"""The controller's event log: written records reach the file at once, appended ones with the next write."""

from __future__ import annotations

import json
from pathlib import Path

from kdvfs.runtime.controller.event_log import EventLog


def _events(path: Path) -> list[str]:
    return [json.loads(line)["event"] for line in path.read_text().splitlines()]


def test_appended_records_reach_the_file_with_the_next_write_or_the_close(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    log = EventLog(path)
    log.write("start")
    assert _events(path) == ["start"]
    log.append("decision", kernel=3)
    assert _events(path) == ["start"]  # still in the buffer: no system call per decision
    log.write("step", step=0)
    assert _events(path) == ["start", "decision", "step"]
    log.append("decision", kernel=4)
    log.close()
    assert _events(path) == ["start", "decision", "step", "decision"]
