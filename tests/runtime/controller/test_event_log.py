"""The controller's event log: written records reach the file at once, appended ones with the next write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kdvfs.runtime.controller.event_log import EventLog, step_line
from kdvfs.runtime.controller.measurement.ab import AUTO, CONTROLLED


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


TIMES = st.floats(allow_nan=True, allow_infinity=True) | st.floats(-1e4, 1e4).map(np.float64)
NANOSECONDS = st.lists(st.integers(-(10**19), 10**19), max_size=60)


@given(step=st.integers(0, 10**9), end_s=TIMES, duration_s=st.none() | TIMES, signature=st.none() | st.integers(),
       matched=st.booleans(), controlled=st.booleans(), next_controlled=st.booleans(), scale=TIMES,
       arm=st.sampled_from([AUTO, CONTROLLED]) | st.text(), anchors_ns=NANOSECONDS, pace_ns=st.none() | NANOSECONDS)
def test_a_step_line_is_json_dumps_of_its_record(**fields: Any) -> None:
    assert step_line(**fields) == json.dumps({"event": "step", **fields}) + "\n"
    pace_ns = fields["pace_ns"]
    if pace_ns is not None:  # the pace's text kept from an earlier step
        assert step_line(**fields, pace_json=str(pace_ns)) == json.dumps({"event": "step", **fields}) + "\n"


def test_a_written_line_flushes_what_was_appended_before_it(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    log = EventLog(path)
    log.append("decision", kernel=3)
    log.write_line(step_line(0, 1.5, None, None, True, False, True, 1.0, AUTO, [1, 2], None))
    assert _events(path) == ["decision", "step"]
    log.close()
