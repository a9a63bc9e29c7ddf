"""Feature estimation for kernels without profiler counters: op formulas, work split, features, priors."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdvfs.common.errors import ProfileError
from kdvfs.common.paths import DATA_DIR
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile
from kdvfs.envs.model.estimate import (
    FEATURE_PRIORS,
    SIMT_GEMM_SM_PER_FLOP,
    SOURCE,
    STREAMING_SM_PER_DRAM,
    derive_priors,
    estimate_features,
    estimate_work,
    is_streaming,
    is_tensor_kernel,
    op_calls,
    split_work,
)
from kdvfs.envs.model.estimate_ops import CAUSAL_FRACTION, conv_output_sizes, dtype_bytes, op_work
from kdvfs.envs.trace.bundled import bundled_traces, open_trace
from kdvfs.envs.trace.ncu import read_ncu_csv
from kdvfs.envs.trace.trace import Category, Features, Kernel, Kind, OpInfo, Phase, Trace, TraceMeta

BF16, F32, I64 = "c10::BFloat16", "float", "long int"


@functools.cache
def h200() -> GpuProfile:
    return load_profile("h200")


@functools.cache
def bundled(name: str) -> Trace:
    return open_trace(name)


def kernel(op: OpInfo | None, name: str = "nvjet_sm90_gemm", category: Category = Category.GEMM,
           duration_s: float = 1e-4, kind: Kind = Kind.KERNEL, **fields: object) -> Kernel:
    return Kernel(name, kind, category, Phase.FORWARD, duration_s, 0.0, op=op, **fields)  # type: ignore[arg-type]


def trace_of(*kernels: Kernel) -> Trace:
    return Trace(TraceMeta("NVIDIA H200", "test", "test"), kernels)


def mm(m: int, k: int, n: int, dtype: str = BF16) -> OpInfo:
    return OpInfo("aten::mm", ((m, k), (k, n)), (dtype, dtype))


def attention(b: int, h: int, s: int, d: int, name: str = "aten::_cudnn_attention_forward") -> OpInfo:
    return OpInfo(name, ((b, h, s, d),) * 3 + ((),) * 3, (BF16,) * 3 + ("", "Scalar", "Scalar"))


def conv(n: int, c: int, hw: int, k: int, r: int) -> OpInfo:
    return OpInfo("aten::cudnn_convolution", ((n, c, hw, hw), (k, c, r, r), (), ()),
                  (BF16, BF16, "ScalarList", "ScalarList"))


def test_dtype_sizes() -> None:
    sizes = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4, "bool": 1,
             "unsigned char": 1, "c10::Float8_e4m3fn": 1}
    assert {t: dtype_bytes(t) for t in sizes} == sizes
    assert dtype_bytes("Scalar") is None and dtype_bytes("TensorList") is None


def test_gemm_formulas() -> None:
    flops, dram_bytes = estimate_work(kernel(mm(8192, 2048, 6144)))
    assert flops == 2 * 8192 * 2048 * 6144
    assert dram_bytes == 2 * (8192 * 2048 + 2048 * 6144 + 8192 * 6144)
    addmm = OpInfo("aten::addmm", ((6144,), (8192, 2048), (2048, 6144), (), ()), (BF16,) * 3 + ("Scalar",) * 2)
    assert estimate_work(kernel(addmm)) == (flops, dram_bytes + 2 * 6144)
    bmm = OpInfo("aten::bmm", ((4, 64, 32), (4, 32, 16)), (F32, F32))
    assert estimate_work(kernel(bmm)) == (2 * 4 * 64 * 32 * 16, 4 * 4 * (64 * 32 + 32 * 16 + 64 * 16))
    linear = OpInfo("aten::linear", ((4, 10, 32), (16, 32), (16,)), (F32,) * 3)
    assert estimate_work(kernel(linear))[0] == 2 * 40 * 32 * 16
    matmul = OpInfo("aten::matmul", ((3, 1, 8, 4), (5, 4, 2)), (F32, F32))  # broadcast batch 3 x 5
    assert estimate_work(kernel(matmul))[0] == 2 * 15 * 8 * 4 * 2


def test_conv_formulas_use_the_output_size_of_the_backward_op() -> None:
    forward = conv(128, 64, 56, 128, 3)
    assert estimate_work(kernel(forward))[0] == 2 * 128 * 56 * 56 * 128 * 64 * 9  # stride 1 assumed
    backward = OpInfo("aten::convolution_backward", ((128, 128, 28, 28), (128, 64, 56, 56), (128, 64, 3, 3)),
                      (BF16,) * 3)
    outputs = conv_output_sizes([backward])
    assert outputs == {((128, 64, 56, 56), (128, 64, 3, 3)): (28, 28)}
    single = 2 * 128 * 28 * 28 * 128 * 64 * 9
    assert estimate_work(kernel(forward), outputs)[0] == single
    assert estimate_work(kernel(backward))[0] == 2 * single  # dgrad + wgrad


def test_attention_formulas() -> None:
    b, h, s, d = 4, 16, 2048, 128
    forward = 4.0 * b * h * s * s * d
    assert estimate_work(kernel(attention(b, h, s, d)))[0] == forward * CAUSAL_FRACTION
    grad = OpInfo("aten::_cudnn_attention_backward", ((b, h, s, d),) * 5 + ((b, h, s, 1),), (BF16,) * 5 + (F32,))
    assert estimate_work(kernel(grad))[0] == 2.5 * forward * CAUSAL_FRACTION
    cross = OpInfo("aten::_scaled_dot_product_flash_attention", ((b, h, 128, d), (b, h, s, d), (b, h, s, d)),
                   (BF16,) * 3)
    assert estimate_work(kernel(cross))[0] == 4.0 * b * h * 128 * s * d  # S_q != S_kv: not causal
    seq_major = OpInfo("aten::_flash_attention_forward", ((b, s, h, d),) * 3, (BF16,) * 3)
    assert estimate_work(kernel(seq_major))[0] == forward * CAUSAL_FRACTION


def test_memory_bound_ops_and_activities() -> None:
    add = OpInfo("aten::add", ((4, 2048, 2048), (2048, 2048), ()), (F32, F32, "Scalar"))
    flops, dram_bytes = estimate_work(kernel(add, "elementwise_kernel", Category.ELEMENTWISE))
    big = 4 * 2048 * 2048
    assert dram_bytes == 4 * (big + 2048 * 2048 + big) and flops is not None and flops > 0
    copy = OpInfo("aten::copy_", ((big,), (big,), ()), (BF16, F32, "Scalar"))
    assert estimate_work(kernel(copy, "copy", Category.COPY_MEMSET))[1] == 6 * big  # destination not read
    nll = OpInfo("aten::nll_loss_forward", ((8192, 50304), (8192,), (), (), ()), (F32, I64, "", "Scalar", "Scalar"))
    assert estimate_work(kernel(nll, "nll", Category.SOFTMAX_LOSS))[1] == 8192 * (8 + 2 * 4)
    memset = kernel(mm(8, 8, 8), "Memset (Device)", Category.COPY_MEMSET, kind=Kind.MEMSET, dram_bytes=64.0)
    assert estimate_work(memset) == (0.0, 64.0)
    assert estimate_work(kernel(None)) == (None, None)
    unrecorded = OpInfo("aten::_fused_adamw_", ((), (), ()), ("TensorList",) * 3)
    assert estimate_work(kernel(unrecorded, "multi_tensor_apply_kernel", Category.OPTIMIZER)) == (None, None)
    cat = OpInfo("aten::cat", ((1000,), ()), ("TensorList", "Scalar"))
    assert estimate_work(kernel(cat, "CatArrayBatchedCopy<OpaqueType<2u>>", Category.COPY_MEMSET))[1] == 4000


def test_tf32_kernels_and_missing_peaks() -> None:
    work = op_work(mm(64, 64, 64, F32), Category.GEMM, "sm90_xmma_gemm_tf32f32")
    assert work is not None and work.precision == "tf32" and work.tensor_cores
    fp32 = op_work(mm(64, 64, 64, F32), Category.GEMM, "nvjet")
    assert fp32 is not None and fp32.precision == "fp32" and not fp32.tensor_cores
    roofline = dataclasses.replace(h200().roofline, peak_flops={"fp32": 1e12})
    profile = dataclasses.replace(h200(), roofline=roofline)
    with pytest.raises(ProfileError, match="bf16"):
        estimate_features(trace_of(kernel(mm(64, 64, 64))), profile)


def test_work_of_one_call_is_split_by_duration() -> None:
    op = OpInfo("aten::native_layer_norm_backward", ((1024, 1024), (1024, 1024)), (F32, F32))
    first = kernel(op, "layer_norm_grad_input", Category.NORM, duration_s=2e-5)
    second = kernel(op, "GammaBetaBackward", Category.OTHER, duration_s=1e-5)
    work = split_work(trace_of(first, second))
    total = estimate_work(first)[1]
    assert work[0] is not None and work[1] is not None and total is not None
    assert work[0].dram_bytes == pytest.approx(total * 2 / 3) and work[1].dram_bytes == pytest.approx(total / 3)


def test_attention_flops_go_to_the_tensor_core_kernel() -> None:
    op = OpInfo("aten::_cudnn_attention_backward", ((2, 4, 256, 64),) * 5, (BF16,) * 5)
    kernels = (kernel(op, "compute_dot_do_o", Category.ATTENTION, 1e-5),
               kernel(op, "cudnn_sdpa_flash_bprop_wgmma", Category.ATTENTION, 8e-5),
               kernel(op, "convert_dq_to_16bits", Category.ATTENTION, 1e-5))
    work = split_work(trace_of(*kernels))
    assert [w.flops if w else None for w in work] == [0.0, estimate_work(kernels[0])[0], 0.0]
    assert [w.tensor_cores if w else None for w in work] == [False, True, False]


def test_op_calls() -> None:
    square = mm(8192, 8192, 2048)
    memset = kernel(square, "Memset", Category.COPY_MEMSET, kind=Kind.MEMSET, dram_bytes=4.0)
    dx, dw = kernel(square, "nvjet_NNT"), kernel(square, "nvjet_NTN")
    splitk = kernel(square, "splitKreduce_kernel")
    copy = OpInfo("aten::copy_", ((64,), (64,)), (BF16, F32))
    cast = kernel(copy, "copy_kernel", Category.COPY_MEMSET)
    chunks = kernel(OpInfo("aten::_foreach_add_", ((512,), ()), ("TensorList", "Scalar")), "multi_tensor_apply")
    kernels = [memset, dx, splitk, memset, dw, cast, cast, chunks, chunks]
    assert op_calls(kernels) == [[1, 2], [4], [5], [6], [7, 8]]
    assert is_tensor_kernel("sm90_xmma_wgrad_implicit_gemm_bf16") and is_tensor_kernel("cutlass::Kernel2<gemm>")
    assert not is_tensor_kernel("init_device_workspace_kernel<xmma::implicit_gemm::fprop>")


def test_features_stay_in_range_and_existing_ones_are_kept() -> None:
    measured = Features(0.5, 0.5, 0.5, 1500.0, "ncu:test")
    kernels = (kernel(mm(8192, 8192, 8192), duration_s=1e-6),  # impossibly fast: clipped to 1
               kernel(mm(64, 64, 64), features=measured),
               kernel(None, "mystery", Category.NORM))
    out = estimate_features(trace_of(*kernels), h200())
    first = out.kernels[0].features
    assert first is not None and first.sm_util == 1.0 and first.tensor_util == 1.0 and first.source == SOURCE
    assert out.kernels[0].flops == 2 * 8192**3
    assert out.kernels[1] == kernels[1]
    prior = FEATURE_PRIORS[Category.NORM]
    assert out.kernels[2].features == Features(prior.sm_util, prior.dram_util, prior.tensor_util, None, SOURCE)
    assert out.kernels[2].flops is None


def test_work_already_on_a_kernel_wins() -> None:
    synthetic = kernel(None, duration_s=1e-3, flops=494.7e9, dram_bytes=4.8e8)
    features = estimate_features(trace_of(synthetic), h200()).kernels[0].features
    assert features is not None
    assert features.tensor_util == pytest.approx(0.5) and features.dram_util == pytest.approx(0.1)


def test_the_pasted_priors_are_those_of_the_bundled_ncu_traces() -> None:
    derived = derive_priors([bundled("h200/gpt3xl-1layer-b4"), bundled("h200/resnet50-b128")])
    assert derived == dict(FEATURE_PRIORS)
    assert set(FEATURE_PRIORS) == set(Category)


@pytest.mark.parametrize("name", bundled_traces())
def test_every_bundled_kernel_gets_features(name: str) -> None:
    trace = bundled(name)
    out = estimate_features(trace, h200())
    assert out.has_features.all()
    for before, after in zip(trace.kernels, out.kernels, strict=True):
        assert after.features is not None
        assert all(0.0 <= v <= 1.0 for v in (after.features.sm_util, after.features.dram_util,
                                              after.features.tensor_util or 0.0))
        if before.features is not None:
            assert after == before


dims = st.integers(min_value=1, max_value=4096)
FAMILIES = {
    "mm": (3, lambda m, k, n: mm(m, k, n)),
    "bmm": (4, lambda b, m, k, n: OpInfo("aten::bmm", ((b, m, k), (b, k, n)), (BF16, BF16))),
    "conv": (5, lambda n, c, hw, k, r: conv(n, c, hw, k, r)),
    "attention": (4, lambda b, h, s, d: attention(b, h, s, d)),
    "add": (3, lambda a, b, c: OpInfo("aten::add", ((a, b, c), (a, b, c), ()), (BF16, BF16, "Scalar"))),
    "layer_norm": (2, lambda a, b: OpInfo("aten::native_layer_norm", ((a, b), (b,), (b,)), (F32,) * 3)),
}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(FAMILIES)), st.lists(dims, min_size=5, max_size=5), st.integers(0, 4),
       st.integers(1, 64))
def test_work_is_finite_nonnegative_and_monotone(family: str, values: list[int], which: int, bump: int) -> None:
    arity, make = FAMILIES[family]
    base = values[:arity]
    grown = list(base)
    grown[which % arity] += bump
    small, large = estimate_work(kernel(make(*base))), estimate_work(kernel(make(*grown)))
    for low, high in zip(small, large, strict=True):
        assert low is not None and high is not None
        assert math.isfinite(low) and math.isfinite(high) and 0.0 <= low <= high


@settings(max_examples=40, deadline=None)
@given(st.lists(dims, min_size=3, max_size=3), st.floats(min_value=1e-7, max_value=1e-1))
def test_estimated_features_are_fractions(shape: list[int], duration_s: float) -> None:
    kernels = (kernel(mm(*shape), duration_s=duration_s),
               kernel(OpInfo("aten::gelu", (tuple(shape),), (BF16,)), "gelu", Category.ELEMENTWISE, duration_s))
    for k in estimate_features(trace_of(*kernels), h200()).kernels:
        assert k.features is not None
        values = (k.features.sm_util, k.features.dram_util, k.features.tensor_util)
        assert all(v is not None and 0.0 <= v <= 1.0 for v in values)


def test_streaming_kernels_load_the_sms_by_the_ncu_ratio_of_copies_fills_and_adds() -> None:
    """STREAMING_SM_PER_DRAM is within the range of the vectorised copy/fill/add kernels in the bundled ncu exports."""
    ratios = [k.sm_util / k.dram_util for name in ("gpt3xl_1layer", "gpt2s_2layer")
              for k in read_ncu_csv(DATA_DIR / "raw" / "h200" / f"ncu_{name}.csv.gz")
              if re.search(r"vectorized_elementwise_kernel<\d+, native::(bfloat16_copy|FillFunctor|CUDAFunctor_add)",
                           k.name) and k.dram_util > 0.05]
    assert len(ratios) >= 10 and min(ratios) <= STREAMING_SM_PER_DRAM <= max(ratios)
    copy = OpInfo("aten::copy_", ((4096, 4096), (4096, 4096)), (BF16, F32))
    vectorized = kernel(copy, "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda",
                        Category.COPY_MEMSET, duration_s=3e-5)
    gelu = kernel(copy, "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl",
                  Category.ELEMENTWISE, duration_s=3e-5)
    out = estimate_features(trace_of(vectorized, gelu), h200()).kernels
    assert is_streaming(vectorized) and not is_streaming(gelu)
    first, second = out[0].features, out[1].features
    assert first is not None and second is not None
    assert first.sm_util == pytest.approx(STREAMING_SM_PER_DRAM * first.dram_util)
    assert second.sm_util == pytest.approx(FEATURE_PRIORS[Category.ELEMENTWISE].sm_per_dram * second.dram_util)


def test_a_simt_gemm_at_the_microbenchmark_fp32_gemm_efficiency_loads_the_sms_fully() -> None:
    """SIMT_GEMM_SM_PER_FLOP is one over the FLOP fraction of the measured fp32 GEMM microbenchmark."""
    micro = json.loads((DATA_DIR / "raw" / "h200" / "power_micro.json").read_text())["gemm_fp32_2048"]
    flop_fraction = 2 * 2048**3 / (micro["us_per_call"] * 1e-6) / h200().roofline.peak_flops["fp32"]
    assert pytest.approx(1 / flop_fraction, abs=0.01) == SIMT_GEMM_SM_PER_FLOP
    duration_s = micro["us_per_call"] * 1e-6
    simt = kernel(mm(2048, 2048, 2048, F32), "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_ffma",
                  duration_s=duration_s)
    half = kernel(mm(2048, 2048, 2048, F32), "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_ffma",
                  duration_s=2 * duration_s)
    out = estimate_features(trace_of(simt, half), h200()).kernels
    assert out[0].features is not None and out[0].features.sm_util == pytest.approx(1.0, abs=0.01)
    assert out[0].features.tensor_util == 0.0
    assert out[1].features is not None and out[1].features.sm_util == pytest.approx(0.5, abs=0.01)
