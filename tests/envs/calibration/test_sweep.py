"""The sweep schema: parsing and writing, reference rows, subsets, clear errors, and the bundled sweeps."""

from __future__ import annotations

import csv
import string
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdvfs.common.paths import DATA_DIR, RAW_DATA_DIR
from kdvfs.envs.calibration.convert import convert_h200_default, convert_wang_chu
from kdvfs.envs.calibration.sweep import REQUIRED_COLUMNS, Sweep, SweepError, load_sweep, parse_sweep, sweep_to_csv
from kdvfs.envs.gpu.profiles import load_profile

SWEEPS = DATA_DIR / "sweeps"
ARRAYS = ("kernel_index", "core_mhz", "mem_mhz", "time_s", "power_w", "sm_util", "dram_util", "tensor_util")
# Kernel names without the characters the writer does not quote (',' becomes ';'; '"' starts a quoted field).
NAME_ALPHABET = string.ascii_letters + string.digits + "_/<>:.-+ ()[];"
clock = st.floats(min_value=1.0, max_value=2.0e4, allow_nan=False, allow_infinity=False)
positive = st.floats(min_value=1e-12, max_value=1e6, allow_nan=False, allow_infinity=False, allow_subnormal=False)
fraction = st.floats(min_value=0.0, max_value=1.0)


@st.composite
def sweeps(draw: st.DrawFn) -> Sweep:
    """Random valid sweeps: 1-5 kernels, >= 2 distinct clock pairs, positive times and powers."""
    labels = draw(st.lists(st.text(NAME_ALPHABET, min_size=1, max_size=12), min_size=1, max_size=5, unique=True))
    pairs = draw(st.lists(st.tuples(clock, clock), min_size=2, max_size=6, unique=True))
    rows = draw(st.lists(st.tuples(st.sampled_from(labels), st.integers(0, len(pairs) - 1), positive, positive,
                                   fraction, fraction, fraction), min_size=2, max_size=30))
    rows[0], rows[1] = (rows[0][0], 0, *rows[0][2:]), (rows[1][0], 1, *rows[1][2:])  # two distinct pairs at least
    names: dict[str, int] = {}
    index = np.array([names.setdefault(row[0], len(names)) for row in rows])
    core, mem = (np.array([pairs[row[1]][i] for row in rows]) for i in (0, 1))
    time_s, power_w, sm, dram, tensor = (np.array([row[i] for row in rows]) for i in range(2, 7))
    return Sweep("random.sweep.csv", tuple(names), index, core, mem, time_s, power_w, sm, dram, tensor)


def assert_same_sweep(actual: Sweep, expected: Sweep) -> None:
    assert actual.kernel_names == expected.kernel_names
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(actual, name), getattr(expected, name), err_msg=name)


@settings(max_examples=25, deadline=None)
@given(sweeps())
def test_csv_round_trip(sweep: Sweep) -> None:
    parsed = parse_sweep(sweep_to_csv(sweep), "random.sweep.csv")
    assert parsed.source == "random.sweep.csv"
    assert_same_sweep(parsed, sweep)


@settings(max_examples=25, deadline=None)
@given(sweeps())
def test_reference_row_is_the_highest_memory_then_core_clock(sweep: Sweep) -> None:
    reference = sweep.reference_rows
    assert reference.shape == (len(sweep.kernel_names),)
    for kernel in range(len(sweep.kernel_names)):
        rows = [r for r in range(len(sweep.time_s)) if sweep.kernel_index[r] == kernel]
        best = max((sweep.mem_mhz[r], sweep.core_mhz[r]) for r in rows)
        chosen = int(reference[kernel])
        assert sweep.kernel_index[chosen] == kernel
        assert (sweep.mem_mhz[chosen], sweep.core_mhz[chosen]) == best
    inputs = sweep.row_inputs()
    np.testing.assert_array_equal(inputs.time_s, sweep.time_s[reference][sweep.kernel_index])
    assert np.isnan(sweep.row_inputs_without_power().power_w).all()


@settings(max_examples=25, deadline=None)
@given(sweeps(), st.data())
def test_subset_renumbers_kernels_and_keeps_their_rows(sweep: Sweep, data: st.DataObject) -> None:
    count = len(sweep.kernel_names)
    chosen = data.draw(st.permutations(range(count)).flatmap(lambda p: st.integers(1, count).map(lambda n: p[:n])))
    sub = sweep.subset(np.asarray(chosen))
    keep = np.isin(sweep.kernel_index, chosen)
    assert sub.kernel_names == tuple(sweep.kernel_names[i] for i in chosen)
    assert sorted(set(sub.kernel_index.tolist())) == list(range(len(chosen)))
    assert [sub.kernel_names[i] for i in sub.kernel_index] == [sweep.kernel_names[i] for i in sweep.kernel_index[keep]]
    for name in ARRAYS[1:]:
        np.testing.assert_array_equal(getattr(sub, name), getattr(sweep, name)[keep], err_msg=name)
    assert sub.source == sweep.source
    assert sub.limits == sweep.limits  # held-out kernels are normalised like the sweep they came from


def test_missing_tensor_column_means_no_tensor_use() -> None:
    text = "kernel,core_mhz,mem_mhz,time_s,power_w,sm_util,dram_util\na,1980,3201,1e-3,500,0.5,0.5\n" \
           "a,990,3201,2e-3,300,0.5,0.5\n"
    sweep = parse_sweep(text, "two.csv")
    np.testing.assert_array_equal(sweep.tensor_util, [0.0, 0.0])
    assert sweep.kernel_names == ("a",) and list(sweep.reference_rows) == [0]


HEADER = ",".join(REQUIRED_COLUMNS)
GOOD = ["a,1980,3201,0.001,500,0.5,0.5", "a,1395,3201,0.0012,400,0.5,0.5", "b,1980,3201,0.002,600,0.9,0.1"]


def sweep_text(header: str = HEADER, third_row: str | None = None) -> str:
    rows = [GOOD[0], third_row if third_row is not None else GOOD[1], GOOD[2]]
    return "\n".join([header, *rows]) + "\n"


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("kernel,core_mhz,mem_mhz,time_s\na,1,1,1\n",
                 ["missing column", "'power_w'", "'sm_util'", "'dram_util'", "a sweep needs",
                  "docs/design/cost-model.md"],
                 id="missing-columns"),
    pytest.param("", ["missing column", "'kernel'", "a sweep needs"], id="empty-file"),
    pytest.param(sweep_text(third_row="a,1395,3201,nan,400,0.5,0.5"),
                 ["row 3", "'time_s'", "nan", "remove or re-measure that row"], id="nan"),
    pytest.param(sweep_text(third_row="a,1395,3201,0.0012,inf,0.5,0.5"),
                 ["row 3", "'power_w'", "inf", "remove or re-measure that row"], id="inf"),
    pytest.param(sweep_text(third_row="a,1395,3201,fast,400,0.5,0.5"),
                 ["row 3", "'time_s'", "'fast' is not a number"], id="non-numeric"),
    pytest.param(sweep_text(third_row="a,1395,3201"), ["row 3", "'time_s'", "is not a number"], id="short-row"),
    pytest.param(sweep_text(third_row="a,1395,3201,-0.0012,400,0.5,0.5"),
                 ["row 3", "'time_s'", "must be > 0", "-0.0012"], id="negative-time"),
    pytest.param(sweep_text(third_row="a,1395,3201,0.0012,0,0.5,0.5"),
                 ["row 3", "'power_w'", "must be > 0", "got 0"], id="zero-power"),
    pytest.param(sweep_text(third_row="a,-1395,3201,0.0012,400,0.5,0.5"),
                 ["row 3", "'core_mhz'", "must be > 0"], id="negative-clock"),
    pytest.param(sweep_text(third_row="a,1395,3201,0.0012,400,1.5,0.5"),
                 ["row 3", "'sm_util'", "fraction in [0, 1]", "1.5"], id="utilisation-above-1"),
    pytest.param(sweep_text(third_row="a,1395,3201,0.0012,400,0.5,-0.1"),
                 ["row 3", "'dram_util'", "fraction in [0, 1]", "-0.1"], id="utilisation-below-0"),
    pytest.param(f"{HEADER},tensor_util\n{GOOD[0]},0.5\na,1395,3201,0.0012,400,0.5,0.5,2\n",
                 ["row 3", "'tensor_util'", "fraction in [0, 1]"], id="tensor-utilisation"),
    pytest.param(sweep_text(third_row=",1395,3201,0.0012,400,0.5,0.5"), ["row 3", "empty 'kernel'"],
                 id="empty-kernel"),
    pytest.param(HEADER + "\n", ["no rows"], id="no-rows"),
    pytest.param(sweep_text(third_row="a,1980,3201,0.0012,400,0.5,0.5"),
                 ["one clock pair", "nothing to fit", "measure at least two pairs"], id="single-pair"),
])
def test_bad_sweeps_fail_naming_file_place_and_fix(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = tmp_path / "bad.sweep.csv"
    path.write_text(text)
    with pytest.raises(SweepError) as caught:
        load_sweep(path)
    message = str(caught.value)
    assert message.startswith(str(path))
    for part in expected:
        assert part in message


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match=r"absent\.csv: no such sweep file"):
        load_sweep(tmp_path / "absent.csv")
    corrupt = tmp_path / "corrupt.csv.gz"
    corrupt.write_bytes(b"\x1f\x8b" + b"\x00" * 20)
    with pytest.raises(SweepError, match="cannot be read"):
        load_sweep(corrupt)


def test_error_row_is_the_file_line_when_blank_lines_precede_it() -> None:
    text = HEADER + "\n" + GOOD[0] + "\n\n" + "a,1395,3201,fast,400,0.5,0.5\n"
    with pytest.raises(SweepError, match="row 4"):
        parse_sweep(text, "blank.csv")


def test_kernel_names_with_quotes_round_trip() -> None:
    sweep = parse_sweep(sweep_text(), "q.csv")
    named = Sweep(sweep.source, ('"quoted"_kernel', "b"), *(getattr(sweep, f.name) for f in fields(Sweep)[2:10]))
    assert parse_sweep(sweep_to_csv(named), "q.csv").kernel_names == ('"quoted"_kernel', "b")


def test_check_clocks_names_the_row_and_the_unsupported_pair() -> None:
    h200 = load_profile("h200")
    sweep = parse_sweep(sweep_text(third_row="a,1234,3201,0.0012,400,0.5,0.5"), "h200-locked.csv")
    with pytest.raises(SweepError) as caught:
        sweep.check_clocks(h200)
    message = str(caught.value)
    assert message.startswith("h200-locked.csv: row 3:")
    assert "(1234, 3201)" in message and "'h200'" in message
    parse_sweep(sweep_text(third_row="a,1230,2201,0.0012,400,0.5,0.5"), "ok.csv").check_clocks(h200)
    load_sweep(SWEEPS / "h200-default.sweep.csv").check_clocks(h200)


@pytest.mark.parametrize(("name", "kernels", "rows", "pairs"), [
    ("gtx980", 30, 750, 25), ("gtx1080ti", 30, 600, 20), ("h200-default", 15, 15, 8),
])
def test_bundled_sweeps_load(name: str, kernels: int, rows: int, pairs: int) -> None:
    sweep = load_sweep(SWEEPS / f"{name}.sweep.csv")
    assert len(sweep.kernel_names) == kernels and len(sweep.time_s) == rows
    assert len(set(zip(sweep.core_mhz.tolist(), sweep.mem_mhz.tolist(), strict=True))) == pairs
    assert np.bincount(sweep.kernel_index).min() == rows // kernels  # every kernel at every pair of the grid


@pytest.mark.parametrize("gpu", ["gtx980", "gtx1080ti"])
def test_wang_chu_converter_reproduces_the_bundled_sweep(gpu: str) -> None:
    converted = convert_wang_chu(RAW_DATA_DIR / "public" / f"{gpu}-dvfs-sweep.csv", gpu)
    bundled = load_sweep(SWEEPS / f"{gpu}.sweep.csv")
    assert_same_sweep(converted, bundled)
    assert sweep_to_csv(converted) == (SWEEPS / f"{gpu}.sweep.csv").read_text()
    assert converted.tensor_util.max() == 0.0
    assert converted.sm_util.min() >= 0.0 and converted.sm_util.max() <= 1.0
    assert converted.dram_util.min() >= 0.0 and converted.dram_util.max() <= 1.0


def test_wang_chu_utilisations_follow_the_documented_formulas() -> None:
    raw = RAW_DATA_DIR / "public" / "gtx1080ti-dvfs-sweep.csv"
    first = next(csv.DictReader(raw.read_text().splitlines()))
    converted = convert_wang_chu(raw, "gtx1080ti")
    mem = float(first["memF"])
    assert converted.kernel_names[0] == f"{first['appName']}/{first['kernel']}/{first['argNo']}"
    assert converted.time_s[0] == pytest.approx(float(first["time/ms"]) / 1e3)
    assert converted.sm_util[0] == pytest.approx(float(first["sm_activity"]) * float(first["executed_ipc"]) / 4)
    peak_gb_s = mem * 2 * 44 / 1e3  # 352-bit bus, two transfers per memory clock
    dram_gb_s = float(first["dram_read_throughput"]) + float(first["dram_write_throughput"])
    assert converted.dram_util[0] == pytest.approx(dram_gb_s / peak_gb_s)


def test_h200_converter_reproduces_the_bundled_sweep() -> None:
    converted = convert_h200_default(RAW_DATA_DIR / "h200")
    bundled = load_sweep(SWEEPS / "h200-default.sweep.csv")
    assert_same_sweep(converted, bundled)
    assert sweep_to_csv(converted) == (SWEEPS / "h200-default.sweep.csv").read_text()
    assert {"idle", "idle_with_context", "steady_gemm_8192_bf16"} <= set(converted.kernel_names)
    assert set(converted.mem_mhz.tolist()) == {3201.0}


def test_wang_chu_converter_rejects_unknown_gpu_and_foreign_csv(tmp_path: Path) -> None:
    raw = RAW_DATA_DIR / "public" / "gtx980-dvfs-sweep.csv"
    with pytest.raises(SweepError) as caught:
        convert_wang_chu(raw, "rtx3080ti")
    assert str(raw) in str(caught.value) and "'rtx3080ti'" in str(caught.value)
    assert "gtx1080ti" in str(caught.value) and "gtx980" in str(caught.value)
    with pytest.raises(SweepError, match="not a Wang & Chu sweep"):
        convert_wang_chu(SWEEPS / "gtx980.sweep.csv", "gtx980")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(SweepError, match="not a Wang & Chu sweep"):
        convert_wang_chu(empty, "gtx980")


@pytest.mark.parametrize("damage", ["truncated", "non-numeric"])
def test_wang_chu_converter_reports_damaged_rows(tmp_path: Path, damage: str) -> None:
    lines = (RAW_DATA_DIR / "public" / "gtx980-dvfs-sweep.csv").read_text().splitlines()[:4]
    if damage == "truncated":
        lines[-1] = lines[-1][: len(lines[-1]) // 2]
    else:
        cells = lines[-1].split(",")
        cells[6] = "fast"  # time/ms
        lines[-1] = ",".join(cells)
    path = tmp_path / "damaged.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SweepError, match=r"damaged\.csv"):
        convert_wang_chu(path, "gtx980")
