"""The kdvfs trace format: exact round trips, versioning, and clear errors for bad files."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdvfs.common.errors import TraceFormatError
from kdvfs.envs.trace.bundled import bundled_traces, open_trace, trace_path
from kdvfs.envs.trace.format import COLUMNS, dumps_trace, load_trace, loads_trace, save_trace
from kdvfs.envs.trace.trace import Category, Features, Kernel, Kind, OpInfo, Phase, Trace, TraceMeta

finite = st.floats(min_value=1e-9, max_value=10.0, allow_nan=False)
fraction = st.floats(min_value=0.0, max_value=1.0)
clock = st.floats(min_value=1.0, max_value=1e5)
dim3 = st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 65535), st.integers(0, 64))
features = st.builds(Features, fraction, fraction, st.none() | fraction, st.none() | clock,
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
                  st.none() | clock, st.none() | clock, st.none() | clock, st.none() | st.integers(0, 9),
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


def _set_row(column: str, value: object) -> Callable[[dict[str, Any]], None]:
    def mutate(document: dict[str, Any]) -> None:
        document["kernels"][3][COLUMNS.index(column)] = value
    return mutate


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_set_row("duration_s", 1e308), r"kernels\[3\]: kernel .*duration_s=1e\+308 must be > 0 and at most 3600"),
        (_set_row("gap_before_s", float("nan")), r"kernels\[3\]: gap_before_s=nan is not a finite number"),
        (_set_row("flops", 10**400), r"kernels\[3\]: flops=1000.* is not a finite number"),
        (_set_row("dram_bytes", 1e30), r"kernels\[3\]: kernel .*dram_bytes=1e\+30 must be >= 0 and at most 1e\+21"),
        (_set_row("grid", [-1, 1, 1]), r"kernels\[3\]: kernel .*grid \(-1, 1, 1\).* must be sizes"),
        (_set_row("clock_mhz", 1e-300), r"kernels\[3\]: clock_mhz=1e-300 MHz is outside \[1, 100000\] MHz"),
        (lambda d: d["ops"][0]["dims"].append(["x"]), r"ops\[0\]: op 'aten::copy_': input dims .* are not sizes"),
        (lambda d: d["ops"][0]["dims"].append(7), r"ops\[0\]: dims=.* is not a list of lists"),
        (lambda d: d["ops"][0]["dims"][0].append(float("inf")), r"ops\[0\]: op .*input dims .* are not sizes"),
        (lambda d: d["ops"][0]["types"].append(None), r"ops\[0\]: types=.* is not a list of strings"),
        (lambda d: d["names"].append(3.5), "'names' must be a list of strings"),
        (lambda d: d["meta"].update(ref_core_mhz=1e-300), r"ref_core_mhz=1e-300 MHz is outside"),
        (lambda d: d["meta"].update(power_limit_w=0.0), r"power_limit_w=\[0.0\] W is outside \[1, 100000\] W"),
        (lambda d: d["meta"].update(power_limit_w="700"), r"power_limit_w='700' is not a finite number"),
        (lambda d: d["meta"].update(power_limit_range_w=[700.0]), r"power_limit_range_w must be \[low, high\]"),
        (lambda d: d["meta"].update(power_limit_w=800.0, power_limit_range_w=[200.0, 700.0]),
         r"power_limit_range_w=\[200.0, 700.0\] W must be \[low, high\] holding power_limit_w=800.0 W"),
    ],
)
def test_values_out_of_range_give_clear_errors(tmp_path: Path, mutate: Callable[[dict[str, Any]], None],
                                               message: str) -> None:
    document = json.loads(trace_path("h200/resnet50-b128").read_text())
    mutate(document)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(TraceFormatError, match=message) as caught:
        load_trace(path)
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)


def test_power_limits_round_trip_and_traces_without_them_load_unchanged(tmp_path: Path) -> None:
    old = open_trace("h200/gpt3xl-1layer-b4")
    assert (old.meta.power_limit_w, old.meta.power_limit_range_w) == (None, None)
    assert "power_limit" not in dumps_trace(old) and dumps_trace(old) == trace_path("h200/gpt3xl-1layer-b4").read_text()
    recorded = TraceMeta(**{**{f: getattr(old.meta, f) for f in ("gpu", "workload", "source", "measurements")},
                            "power_limit_w": 650.0, "power_limit_range_w": (200.0, 700.0)})
    trace = Trace(recorded, old.kernels)
    save_trace(trace, tmp_path / "t.json.gz")
    loaded = load_trace(tmp_path / "t.json.gz")
    assert loaded == trace and (loaded.meta.power_limit_w, loaded.meta.power_limit_range_w) == (650.0, (200.0, 700.0))
    meta = json.loads(dumps_trace(trace))["meta"]
    assert (meta["power_limit_w"], meta["power_limit_range_w"]) == (650.0, [200.0, 700.0])
