"""The cost model on the recorded H200 workload captures (``data/traces/h200/workloads``): joules per step at auto
against the NVML measurement, the mixture of experts included."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from kdvfs.common.paths import DATA_DIR
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile
from kdvfs.envs.model.cost_tables import build_tables, step_breakdown
from kdvfs.envs.model.estimate import estimate_features, is_streaming
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.trace import Category, Trace

CAPTURES = sorted((DATA_DIR / "traces" / "h200" / "workloads").glob("*.trace.json.gz"))
GUARD = 0.07  # every capture (the target is 5%: benchmarks/results/workloads_h200.md lists the misses)
MOE_TARGET = 0.05


@functools.cache
def h200() -> GpuProfile:
    return load_profile("h200")


@functools.cache
def capture(path: Path) -> Trace:
    return load_trace(path)


def auto_error(trace: Trace) -> float:
    tables = build_tables(trace, h200())
    step = step_breakdown(trace, tables, tables.auto_time_s[:, 0], tables.auto_energy_j[:, 0],
                          tables.auto_gap_power_w[:, 0])
    return step["energy_j"] / trace.meta.measurements["energy_j_per_step"] - 1.0


def test_the_captures_include_a_mixture_of_experts_and_launch_bound_steps() -> None:
    names = {path.name.split(".")[0] for path in CAPTURES}
    assert {"mixtral-b8-s1024", "llama-b8-s128", "bert-b32-s128", "vit-b64", "gpt2s-compiled-b16"} <= names
    moe = capture(CAPTURES[[p.name for p in CAPTURES].index("mixtral-b8-s1024.trace.json.gz")])
    ops = {k.op.name for k in moe.kernels if k.op}
    assert {"aten::topk", "aten::histc", "aten::index", "aten::_index_put_impl_", "aten::mm"} <= ops
    launch_bound = capture(CAPTURES[[p.name for p in CAPTURES].index("llama-b8-s128.trace.json.gz")])
    assert launch_bound.busy_s < 0.5 * launch_bound.meta.measurements["step_time_s"]


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name.split(".")[0])
def test_joules_per_step_at_auto_match_the_measurement(path: Path) -> None:
    error = auto_error(capture(path))
    assert abs(error) <= (MOE_TARGET if path.name.startswith("mixtral") else GUARD), f"{error:+.1%}"


def test_moe_expert_gemms_off_the_tensor_cores_load_the_sms_fully() -> None:
    moe = capture(CAPTURES[[p.name for p in CAPTURES].index("mixtral-b8-s1024.trace.json.gz")])
    estimated = estimate_features(moe, h200()).kernels
    simt = [k for k in estimated if k.category is Category.GEMM and ("sgemm" in k.name or "ffma" in k.name)]
    assert simt and all(k.features is not None and k.features.tensor_util == 0.0 for k in simt)
    busy = sum(k.duration_s * k.features.sm_util for k in simt if k.features) / sum(k.duration_s for k in simt)
    assert busy > 0.9


def test_streaming_copies_are_told_from_arithmetic_kernels() -> None:
    moe = capture(CAPTURES[[p.name for p in CAPTURES].index("mixtral-b8-s1024.trace.json.gz")])
    names = {k.name: is_streaming(k) for k in moe.kernels}
    assert any(flag for name, flag in names.items() if "bfloat16_copy_kernel" in name)
    assert not any(flag for name, flag in names.items() if "silu" in name.lower() or "gemm" in name)
