"""The online decisions' log lines: exactly what ``json.dumps`` writes for the same record, for any figures."""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kdvfs.runtime.controller.decisions.decision_records import DecisionRecords, RecentDurations
from kdvfs.runtime.controller.event_log import EventLog

LABELS = ("auto:3201", "1980:3201", "1410:2201", 'odd "label"\\')
PAIRS = st.integers(0, len(LABELS) - 1)
FIGURES = st.floats(allow_nan=True, allow_infinity=True) | st.floats(-1e3, 1e3).map(np.float64)


@given(step=st.integers(0, 10**9), kernel=st.integers(0, 10**6), source=st.sampled_from(["anchor", "expected"]),
       in_effect=PAIRS, pending=st.none() | PAIRS, budget_pct=FIGURES, budget_used=FIGURES, affordable_pct=FIGURES,
       action=st.tuples(st.integers(0, 1), st.integers(0, 200), st.integers(0, 3)), clocks=st.none() | PAIRS,
       wall_us=FIGURES, next_wake=st.sampled_from(["policy", "arrival", "poll", "change"]))
def test_a_line_is_json_dumps_of_its_record(**fields: object) -> None:
    records = DecisionRecords(LABELS)
    line = records.line(**fields)  # type: ignore[arg-type]
    assert line == json.dumps(records.record(**fields)) + "\n"  # type: ignore[arg-type]


def test_lines_and_records_are_written_in_order(tmp_path: Path) -> None:
    log, records = EventLog(tmp_path / "run.jsonl"), DecisionRecords(LABELS)
    log.append("request", clocks="1980:3201")
    log.append_line(records.line(3, 7, "anchor", 1, None, 1.0, 0.25, 1.5, (1, 2, 0), 2, 17.5, "policy"))
    log.write("step", step=3)
    log.close()
    events = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["request", "decision", "step"]
    assert events[1]["in_effect"] == "1980:3201" and events[1]["clocks"] == "1410:2201" and events[1]["pending"] is None


@settings(max_examples=500, deadline=None)  # the first call compiles (or loads) the percentile
@given(durations_s=st.lists(st.floats(0.0, 1e-2) | st.floats(allow_nan=True, allow_infinity=True), max_size=40),
       size=st.integers(1, 16), q=st.floats(0.0, 100.0) | st.sampled_from([90, 50, 99]))
def test_recent_durations_are_the_last_ones_with_numpys_percentiles(durations_s: list[float], size: int,
                                                                   q: float) -> None:
    recent, last = RecentDurations(size), collections.deque[float](maxlen=size)
    for duration_s in durations_s:
        recent.append(duration_s)
        last.append(duration_s)
    assert recent.latest_s is (last[-1] if last else None)  # the very value added last
    with np.errstate(invalid="ignore"):  # numpy's own inf - inf
        expected = float(np.percentile(last, q)) if last else 0.0
    found = recent.percentile(q)
    assert found == expected or (math.isnan(found) and math.isnan(expected))
