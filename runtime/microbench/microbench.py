"""The microbenchmarks of ``kdvfs calibrate``: the kernel classes of a GPT-3-XL training step, in PyTorch.

Each runs one kernel of a GPT-3-XL layer (d=2048, 16 heads, sequence 2048, batch 4: 8192 tokens, vocabulary
50304) on the shapes of that layer, so that it is the same kernel template on the same shapes as a row of
the bundled Nsight Compute export of that layer (``data/raw/h200/ncu_gpt3xl_1layer.csv.gz``); that row
gives its SM, DRAM and tensor-pipe utilisations (the cost model's features). The matches of the 11
classes of ``power_micro.json`` are ``kdvfs.envs.calibration.convert.H200_NCU_MATCH``; the bias-gradient reduction is
matched here (same ``reduce_kernel`` over a [8192, 8192] bf16 gradient, row 51); the two steady loops
(an 8192^3 bf16 GEMM, a 2 GiB copy) take the features of the GEMM and copy of the same template, and the
fp32 GEMM those of ``H200_FP32_GEMM_FEATURES``. The features were measured on an H200; on another GPU
they are an approximation (utilisations relative to that GPU's own peaks differ little between Hopper
and Ampere parts, more for older ones). ``scale`` shrinks every dimension (CPU tests).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kdvfs.common.paths import RAW_DATA_DIR
from kdvfs.envs.calibration.convert import H200_FP32_GEMM_FEATURES, H200_NCU_MATCH
from kdvfs.envs.trace.ncu import read_ncu_csv

NCU_EXPORT = RAW_DATA_DIR / "h200" / "ncu_gpt3xl_1layer.csv.gz"
EXTRA_NCU_MATCH = {"reduce_bias_grad_bf16": 51}
"""Class -> row of NCU_EXPORT beyond H200_NCU_MATCH: ``reduce_kernel<128, 4, ReduceOp<BFloat16, sum>>``
summing the MLP's [8192, 8192] bias gradient over tokens (launch grid 64 x 33)."""
FEATURES_LIKE = {"steady_gemm_8192_bf16": "gemm_qkv_fwd", "steady_copy_2GiB": "copy_bf16"}
"""Steady loops -> the class whose features they take (as ``kdvfs.envs.calibration.convert`` does for the
bundled probe)."""

Call = Callable[[], object]
Features = tuple[float, float, float]


@dataclass(frozen=True)
class Microbenchmark:
    """One kernel class: its sweep name and a builder of a call running it once on ``device`` at ``scale``."""

    name: str
    build: Callable[[torch.device, float], Call]


def _n(size: int, scale: float) -> int:
    return max(8, int(size * scale) // 8 * 8)


def _rand(device: torch.device, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=device, dtype=dtype)


def _linear(tokens: int, d_in: int, d_out: int) -> Callable[[torch.device, float], Call]:
    def build(device: torch.device, scale: float) -> Call:
        x = _rand(device, torch.bfloat16, _n(tokens, scale), _n(d_in, scale))
        w = _rand(device, torch.bfloat16, _n(d_out, scale), _n(d_in, scale))
        b = _rand(device, torch.bfloat16, _n(d_out, scale))
        return lambda: F.linear(x, w, b)
    return build


def _mm(size: int, dtype: torch.dtype) -> Callable[[torch.device, float], Call]:
    def build(device: torch.device, scale: float) -> Call:
        a, b = (_rand(device, dtype, _n(size, scale), _n(size, scale)) for _ in range(2))
        return lambda: torch.mm(a, b)
    return build


def _attention(device: torch.device, scale: float) -> Call:
    q, k, v = (_rand(device, torch.bfloat16, 4, 16, _n(2048, scale), 128) for _ in range(3))
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _layernorm(device: torch.device, scale: float) -> Call:
    d = _n(2048, scale)
    x, w, b = _rand(device, torch.float32, _n(8192, scale), d), _rand(device, torch.float32, d), \
        _rand(device, torch.float32, d)
    return lambda: F.layer_norm(x, (d,), w, b)


def _unary(rows: int, cols: int, dtype: torch.dtype, op: Callable[[torch.Tensor], object]
           ) -> Callable[[torch.device, float], Call]:
    def build(device: torch.device, scale: float) -> Call:
        x = _rand(device, dtype, _n(rows, scale), _n(cols, scale))
        return lambda: op(x)
    return build


def _add(device: torch.device, scale: float) -> Call:
    a, b, out = (_rand(device, torch.float32, _n(8192, scale), _n(2048, scale)) for _ in range(3))
    return lambda: torch.add(a, b, out=out)


def _copy(elements: int, source: torch.dtype) -> Callable[[torch.device, float], Call]:
    def build(device: torch.device, scale: float) -> Call:
        src = _rand(device, source, _n(elements, scale))
        dst = torch.empty(src.shape, device=device, dtype=torch.bfloat16)
        return lambda: dst.copy_(src)
    return build


def _adamw(device: torch.device, scale: float) -> Call:
    d = _n(2048, scale)
    shapes = [(3 * d, d), (3 * d,), (d, d), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
    params = [torch.nn.Parameter(_rand(device, torch.float32, *shape)) for shape in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-6, fused=device.type == "cuda")
    return optimizer.step


MICROBENCHMARKS = (
    Microbenchmark("gemm_qkv_fwd", _linear(8192, 2048, 6144)),
    Microbenchmark("gemm_fc_fwd", _linear(8192, 2048, 8192)),
    Microbenchmark("gemm_out_fwd", _linear(8192, 8192, 2048)),
    Microbenchmark("gemm_fp32_2048", _mm(2048, torch.float32)),
    Microbenchmark("flash_attn_fwd", _attention),
    Microbenchmark("layernorm_fp32", _layernorm),
    Microbenchmark("gelu_bf16", _unary(8192, 8192, torch.bfloat16, F.gelu)),
    Microbenchmark("add_fp32", _add),
    Microbenchmark("softmax_vocab", _unary(8192, 50304, torch.bfloat16, lambda x: torch.log_softmax(x, dim=-1))),
    Microbenchmark("copy_bf16", _copy(50304 * 2048, torch.float32)),
    Microbenchmark("adamw_fused", _adamw),
    Microbenchmark("reduce_bias_grad_bf16", _unary(8192, 8192, torch.bfloat16, lambda x: x.sum(dim=0))),
    Microbenchmark("steady_gemm_8192_bf16", _mm(8192, torch.bfloat16)),
    Microbenchmark("steady_copy_2GiB", _copy(2**30, torch.bfloat16)),
)


@functools.cache
def microbenchmark_features() -> dict[str, Features]:
    """(sm_util, dram_util, tensor_util) of every microbenchmark, from the bundled H200 ncu export."""
    rows = read_ncu_csv(NCU_EXPORT)
    features = {name: (rows[i].sm_util, rows[i].dram_util, rows[i].tensor_util or 0.0)
                for name, i in {**H200_NCU_MATCH, **EXTRA_NCU_MATCH}.items()}
    features["gemm_fp32_2048"] = H200_FP32_GEMM_FEATURES
    features.update({name: features[like] for name, like in FEATURES_LIKE.items()})
    return features
