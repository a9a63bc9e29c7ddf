"""Kernel classification from names and launching ops (names taken from real H200 traces)."""

from __future__ import annotations

import pytest

from kdvfs.envs.trace.classify import classify
from kdvfs.envs.trace.trace import Category, Kind

CASES = [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", "aten::addmm", Category.GEMM),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", "aten::cudnn_convolution",
     Category.GEMM),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_bf16_64x128_64x4_nt_align8>(Params)", None, Category.GEMM),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", None, Category.GEMM),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
     "aten::_cudnn_attention_forward", Category.ATTENTION),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)", None, Category.ATTENTION),
    ("void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(int)", "aten::_cudnn_attention_backward",
     Category.ATTENTION),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int)",
     "aten::native_layer_norm", Category.NORM),
    ("void at::native::batch_norm_collect_statistics_channels_last_kernel<at::native::Var>(int)",
     "aten::native_batch_norm", Category.NORM),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl(int)>", "aten::gelu",
     Category.ELEMENTWISE),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "aten::add",
     Category.ELEMENTWISE),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*)", "aten::_log_softmax",
     Category.SOFTMAX_LOSS),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float>(float*)",
     "aten::nll_loss_forward", Category.SOFTMAX_LOSS),
    ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float>>(int)", "aten::sum", Category.REDUCTION),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>(int)",
     "aten::_fused_adamw_", Category.OPTIMIZER),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda>", "aten::copy_",
     Category.COPY_MEMSET),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "aten::fill_",
     Category.COPY_MEMSET),
    ("void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int)", "aten::gather",
     Category.EMBEDDING),
    ("void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float>(long*)",
     "aten::embedding_dense_backward", Category.EMBEDDING),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", None, Category.COMMUNICATION),
    ("gloo:all_reduce", None, Category.COMMUNICATION),  # DDP's gradients on the CPU (a CPU-test-mode capture)
    ("gloo:all_gather", None, Category.COMMUNICATION),  # FSDP's unsharding on the CPU
    ("my_custom_kernel", None, Category.OTHER),
]


@pytest.mark.parametrize(("name", "op", "expected"), CASES)
def test_common_kernel_names(name: str, op: str | None, expected: Category) -> None:
    assert classify(name, op) is expected


def test_lambda_in_a_name_is_not_an_optimizer() -> None:
    name = "void at::native::elementwise_kernel<128, 2, gpu_kernel_impl<{lambda(int)#1}>>(int)"
    assert classify(name, "aten::add") is Category.ELEMENTWISE


def test_memsets_and_memcpys_are_copies_whatever_launched_them() -> None:
    assert classify("Memset (Device)", "aten::mm", Kind.MEMSET) is Category.COPY_MEMSET
    assert classify("Memcpy DtoD (Device -> Device)", None, Kind.MEMCPY) is Category.COPY_MEMSET


def test_kernels_inside_optimizer_step_are_optimizer_work() -> None:
    assert classify("void at::native::vectorized_elementwise_kernel<add>", "aten::add_", in_optimizer=True) \
        is Category.OPTIMIZER
