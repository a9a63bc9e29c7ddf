"""Nsight Compute raw CSV parsing and trace enrichment."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdvfs.common.errors import TraceFormatError
from kdvfs.common.paths import RAW_DATA_DIR
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.importing import import_trace
from kdvfs.envs.trace.ncu import (
    CLOCK_COLUMN,
    DRAM_COLUMNS,
    NAME_COLUMN,
    SM_COLUMN,
    enrich_with_ncu,
    kernel_key,
    parse_ncu_csv,
    read_ncu_csv,
)
from kdvfs.envs.trace.trace import Kind

RAW = RAW_DATA_DIR / "h200"
HEADER = ["ID", NAME_COLUMN, SM_COLUMN, DRAM_COLUMNS[0], CLOCK_COLUMN]


def _csv(rows: list[list[str]], preamble: str = "==PROF== Connected to process 1\n") -> str:
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(HEADER)
    writer.writerow(["", "", "%", "%", "hz"])
    writer.writerows(rows)
    return preamble + out.getvalue()


@pytest.mark.parametrize(("name", "rows"), [("ncu_gpt3xl_1layer", 115), ("ncu_gpt2s_2layer", 171),
                                            ("ncu_resnet50_first400", 400)])
def test_real_exports_parse(name: str, rows: int) -> None:
    kernels = read_ncu_csv(RAW / f"{name}.csv.gz")
    assert len(kernels) == rows
    assert all(0 <= k.sm_util <= 1 and 0 <= k.dram_util <= 1 for k in kernels)
    assert all(k.clock_mhz is not None and 300 < k.clock_mhz < 2100 for k in kernels)


percent = st.floats(min_value=0, max_value=150, allow_nan=False).map(lambda x: f"{x:,.2f}")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.text(alphabet="abc_<>:( )", min_size=1, max_size=20), percent, percent,
                          st.integers(300_000_000, 2_000_000_000).map(lambda x: f"{x:,}")), min_size=1, max_size=10))
def test_generated_exports_parse(rows: list[tuple[str, str, str, str]]) -> None:
    text = _csv([[str(i), *row] for i, row in enumerate(rows)])
    kernels = parse_ncu_csv(text, "gen.csv")
    assert [k.name for k in kernels] == [r[0] for r in rows]
    for kernel, row in zip(kernels, rows, strict=True):
        assert kernel.sm_util == pytest.approx(min(1.0, float(row[1].replace(",", "")) / 100))
        assert kernel.clock_mhz == pytest.approx(float(row[3].replace(",", "")) / 1e6)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello,world\n1,2\n", "no ncu header"),
        ('"ID","Kernel Name"\n"","" \n"0","k"\n', "missing column"),
        (_csv([["0", "k", "12", "3"]]), "truncated"),
        (_csv([["0", "k", "abc", "3", "1"]]), "not a number"),
        (_csv([["0", "k", "n/a", "3", "1"]]), "no sm__throughput"),
        (_csv([]), "no kernel rows"),
    ],
)
def test_bad_exports(text: str, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        parse_ncu_csv(text, "bad.csv")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no such file"):
        read_ncu_csv(tmp_path / "none.csv")


def test_kernel_keys_agree_across_demangling_styles() -> None:
    kineto = "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, bool)"
    ncu = "void native::vectorized_gather_kernel<16, long>(char *, char *, T2 *, int, long, bool)"
    assert kernel_key(kineto) == kernel_key(ncu) == "vectorized_gather_kernel"
    assert kernel_key("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<X<int>>(int)") == \
        kernel_key("void <unnamed>::multi_tensor_apply_kernel<X<int>>(int)")
    gemm = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    assert kernel_key(gemm) == gemm


def test_enrichment_matches_kernels_in_order() -> None:
    trace = import_trace(RAW / "trace_resnet50_b128.json.gz")
    enriched, matched = enrich_with_ncu(trace, read_ncu_csv(RAW / "ncu_resnet50_first400.csv.gz"), "r.csv")
    assert matched == 400
    with_features = [k for k in enriched.kernels if k.features is not None]
    assert len(with_features) == 400 and all(k.kind is Kind.KERNEL for k in with_features)
    assert with_features[0].features is not None and with_features[0].features.source == "ncu:r.csv"
    assert enriched.kernels[:10] != trace.kernels[:10]


def test_bundled_gpt3xl_layer_carries_ncu_counters() -> None:
    trace = open_trace("h200/gpt3xl-1layer-b4")
    assert int(trace.has_features.sum()) >= 110
    gemm_util = [k.features.tensor_util for k in trace.kernels if k.features and k.category.value == "gemm"]
    assert gemm_util and max(u or 0.0 for u in gemm_util) > 0.3
