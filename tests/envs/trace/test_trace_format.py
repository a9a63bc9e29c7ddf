"""The kdvfs trace format: exact round trips, versioning, and clear errors for bad files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdvfs.envs.common.errors import TraceFormatError
from kdvfs.envs.trace.bundled import bundled_traces, open_trace, trace_path
from kdvfs.envs.trace.format import dumps_trace, load_trace, loads_trace, save_trace
from kdvfs.envs.trace.trace import Category, Features, Kernel, Kind, OpInfo, Phase, Trace, TraceMeta

finite = st.floats(min_value=1e-9, max_value=10.0, allow_nan=False)
fraction = st.floats(min_value=0.0, max_value=1.0)
dim3 = st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 65535), st.integers(0, 64))
features = st.builds(Features, fraction, fraction, st.none() | fraction, st.none() | finite,
                     st.sampled_from(["ncu:a.csv", "synthetic"]))
ops = st.builds(OpInfo, st.text(max_size=20),
                st.lists(st.lists(st.integers(0, 10**6), max_size=4).map(tuple), max_size=3).map(tuple),
                st.lists(st.sampled_from(["float", "c10::BFloat16", ""]), max_size=3).map(tuple))
kernels = st.builds(
    Kernel, name=st.text(min_size=1, max_size=40), kind=st.sampled_from(Kind), category=st.sampled_from(Category),
    phase=st.sampled_from(Phase), duration_s=finite, gap_before_s=st.just(0.0) | finite, grid=dim3, block=dim3,
    op=st.none() | ops, flops=st.none() | finite, dram_bytes=st.none() | finite, features=st.none() | features,
)
metas = st.builds(TraceMeta, st.text(max_size=10), st.text(max_size=10), st.text(max_size=10),
                  st.none() | finite, st.none() | finite, st.none() | finite, st.none() | st.integers(0, 9),
                  st.dictionaries(st.sampled_from(["energy_j_per_step", "step_time_s"]), finite))
traces = st.builds(Trace, metas, st.lists(kernels, min_size=1, max_size=8).map(tuple))


@settings(max_examples=60, deadline=None)
@given(traces)
def test_any_trace_round_trips_exactly(trace: Trace) -> None:
    assert loads_trace(dumps_trace(trace)) == trace


@pytest.mark.parametrize("name", bundled_traces())
def test_bundled_traces_round_trip_through_files(name: str, tmp_path: Path) -> None:
    trace = open_trace(name)
    for suffix in (".json", ".json.gz"):
        save_trace(trace, tmp_path / f"t{suffix}")
        assert load_trace(tmp_path / f"t{suffix}") == trace


def test_saved_file_is_one_kernel_per_line(tmp_path: Path) -> None:
    trace = open_trace("h200/gpt3xl-1layer-b4")
    save_trace(trace, tmp_path / "t.json")
    lines = (tmp_path / "t.json").read_text().splitlines()
    assert sum(1 for line in lines if line.startswith("[")) == len(trace)


def _bundled_text() -> str:
    return trace_path("h200/gpt3xl-1layer-b4").read_text()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda text: text[: len(text) // 2], "not valid JSON"),
        (lambda text: json.dumps({"traceEvents": []}), "not a kdvfs trace"),
        (lambda text: text.replace('"version": 1', '"version": 99'), "version 99"),
        (lambda text: text.replace('"kind"', '"kindx"', 1), "columns"),
        (lambda text: text.replace('"forward"', '"sideways"', 1), "phase='sideways'"),
        (lambda text: text.replace('"workload": "gpt3xl-1layer-b4"', '"workload": 3'), "meta.workload"),
    ],
)
def test_bad_files_give_clear_errors(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.json"
    path.write_text(mutate(_bundled_text()))
    with pytest.raises(TraceFormatError, match=message) as caught:
        load_trace(path)
    assert str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_negative_duration_names_the_kernel_row(tmp_path: Path) -> None:
    document = json.loads(_bundled_text())
    document["kernels"][3][4] = -1.0
    path = tmp_path / "neg.json"
    path.write_text(json.dumps(document))
    with pytest.raises(TraceFormatError, match=r"kernels\[3\].*duration_s"):
        load_trace(path)


def test_truncated_gzip_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(_bundled_text().encode())[:500])
    with pytest.raises(TraceFormatError, match="corrupt or truncated"):
        load_trace(path)
    with pytest.raises(TraceFormatError, match="no such file"):
        load_trace(tmp_path / "missing.json")
