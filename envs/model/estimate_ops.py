"""FLOPs and DRAM bytes of one framework op from the shapes and dtypes the PyTorch profiler recorded.

Shapes are the logical sizes PyTorch records (``sizes()``): a channels-last convolution input is still
listed as ``[N, C, H, W]``. A tensor list is one dim holding its total element count; an empty dim tuple
on a tensor list means the profiler kept no sizes, so the op's work is unknown. Byte counts are the
minimum DRAM traffic (every operand read once, every result written once) except where an op is known to
make several passes (batch norm). Formulas and their assumptions: ``docs/design/feature-estimation.md``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kdvfs.envs.trace.trace import Category, OpInfo

# Element size (bytes) of every dtype string PyTorch's profiler writes into "Input type".
DTYPE_BYTES: Mapping[str, int] = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
    "long int": 8, "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "unsigned short": 2, "unsigned int": 4, "unsigned long": 8,
    "c10::complex<float>": 8, "c10::complex<double>": 16, "c10::complex<c10::Half>": 4,
    "c10::qint8": 1, "c10::quint8": 1, "c10::qint32": 4,
}
# Roofline precision (a ``peak_flops`` key) of the floating dtypes; every other dtype computes as fp32.
PRECISION: Mapping[str, str] = {
    "double": "fp64", "float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
}
TENSOR_PRECISIONS = frozenset({"bf16", "fp16", "fp8", "tf32"})
TENSOR_LIST = "TensorList"
# Elements of a tensor list whose dtype neither the op nor the kernel name tells are taken as fp32.
DEFAULT_ELEMENT_BYTES = 4
# Share of the S_q x S_kv score matrix an attention kernel computes when S_q == S_kv: the profiler does not
# record is_causal, and kdvfs's workloads (decoder LMs) mask causally, so half of it (see the docs).
CAUSAL_FRACTION = 0.5
ATTENTION_BACKWARD_FACTOR = 2.5  # 5 GEMMs of the backward pass (with recompute) over the 2 of the forward
# Rough arithmetic per element of the largest operand for ops off the tensor cores (FLOPs).
FLOPS_PER_ELEMENT: Mapping[Category, float] = {
    Category.ELEMENTWISE: 2.0, Category.NORM: 8.0, Category.SOFTMAX_LOSS: 5.0, Category.REDUCTION: 1.0,
    Category.OPTIMIZER: 12.0, Category.EMBEDDING: 0.0, Category.COPY_MEMSET: 0.0,
    Category.COMMUNICATION: 1.0, Category.OTHER: 1.0, Category.GEMM: 2.0, Category.ATTENTION: 2.0,
}

_MATMUL_FIRST_OPERAND: Mapping[str, int] = {
    "aten::mm": 0, "aten::bmm": 0, "aten::matmul": 0, "aten::_scaled_mm": 0,
    "aten::addmm": 1, "aten::baddbmm": 1, "aten::addbmm": 1,
}
_ATTENTION = re.compile(r"^aten::(?:_cudnn_attention|_scaled_dot_product_\w*attention|_flash_attention"
                        r"|_efficient_attention)\w*$")
_SEQ_MAJOR_ATTENTION = re.compile(r"^aten::_(?:flash|efficient)_attention")  # q is [B, S, H, D]
_WRITE_ONLY_FIRST = frozenset({"aten::copy_", "aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_"})
_WRITTEN_INPUTS: Mapping[str, tuple[int, ...]] = {"aten::_fused_adamw_": (0, 2, 3), "aten::_fused_adam_": (0, 2, 3)}
_REDUCTIONS = frozenset(f"aten::{n}" for n in (
    "sum", "mean", "amax", "amin", "max", "min", "norm", "linalg_vector_norm", "var", "std", "prod", "argmax",
    "argmin", "any", "all", "var_mean", "std_mean", "logsumexp"))
_PASSES_OVER_LARGEST: Mapping[str, float] = {
    "aten::native_batch_norm": 3.0, "aten::cudnn_batch_norm": 3.0, "aten::_batch_norm_with_update": 3.0,
    "aten::native_batch_norm_backward": 5.0, "aten::cudnn_batch_norm_backward": 5.0,
    "aten::native_layer_norm_backward": 5.0,  # dX kernel reads dY, X and writes dX; dgamma/dbeta reads both again
}
_OPAQUE_TYPE = re.compile(r"OpaqueType<(\d+)u?>")


@dataclass(frozen=True)
class OpWork:
    """Work of one op call: FLOPs, minimum DRAM bytes, roofline precision, whether it runs on tensor cores."""

    flops: float
    dram_bytes: float
    precision: str
    tensor_cores: bool


@dataclass(frozen=True)
class _Tensor:
    dims: tuple[int, ...]
    dtype: str
    element_bytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> float:
        return float(self.numel * self.element_bytes)


def dtype_bytes(dtype: str) -> int | None:
    """Bytes per element of a profiler dtype string (``"c10::BFloat16"`` -> 2), None for non-tensors."""
    return DTYPE_BYTES.get(dtype)


def _tensors(op: OpInfo, kernel_name: str) -> list[_Tensor] | None:
    """The op's tensor inputs in order; None when a tensor list's sizes were not recorded."""
    known = [t for t in op.input_types if t in DTYPE_BYTES]
    opaque = _OPAQUE_TYPE.search(kernel_name)
    list_bytes = int(opaque.group(1)) if opaque else DTYPE_BYTES[known[0]] if known else DEFAULT_ELEMENT_BYTES
    tensors = []
    for dims, dtype in zip(op.input_dims, op.input_types, strict=False):
        if dtype == TENSOR_LIST:
            if not dims:
                return None
            tensors.append(_Tensor(dims, dtype, list_bytes))
        elif dtype in DTYPE_BYTES:
            tensors.append(_Tensor(dims, dtype, DTYPE_BYTES[dtype]))
    return tensors


def _precision(tensors: Sequence[_Tensor], kernel_name: str) -> str:
    if "tf32" in kernel_name.lower():
        return "tf32"
    return next((PRECISION[t.dtype] for t in tensors if t.dtype in PRECISION), "fp32")


def _tensor_work(flops: float, dram_bytes: float, tensors: Sequence[_Tensor], kernel_name: str) -> OpWork:
    precision = _precision(tensors, kernel_name)
    return OpWork(flops, dram_bytes, precision, precision in TENSOR_PRECISIONS)


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(batch, M, K, N) of ``a @ b`` under torch.matmul's broadcasting (1-D operands included)."""
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    a_batch, b_batch = a2[:-2], b2[:-2]
    width = max(len(a_batch), len(b_batch))
    padded_a = (1,) * (width - len(a_batch)) + a_batch
    padded_b = (1,) * (width - len(b_batch)) + b_batch
    batch = math.prod(max(x, y) for x, y in zip(padded_a, padded_b, strict=True))
    return batch, a2[-2], a2[-1], b2[-1]


def _gemm_work(op: OpInfo, tensors: Sequence[_Tensor], kernel_name: str) -> OpWork | None:
    """2 * batch * M * K * N FLOPs; bytes: every operand (bias included) plus the result, in mat1's dtype."""
    if op.name == "aten::linear":
        if len(tensors) < 2 or len(tensors[1].dims) != 2:
            return None
        x, weight = tensors[0], tensors[1]
        batch, m, k, n = 1, x.numel // max(weight.dims[1], 1), weight.dims[1], weight.dims[0]
    else:
        first = _MATMUL_FIRST_OPERAND[op.name]
        if len(tensors) < first + 2 or not tensors[first].dims or not tensors[first + 1].dims:
            return None
        x = tensors[first]
        batch, m, k, n = _matmul_shape(x.dims, tensors[first + 1].dims)
    out_bytes = batch * m * n * x.element_bytes
    return _tensor_work(2.0 * batch * m * k * n, sum(t.nbytes for t in tensors) + out_bytes, [x], kernel_name)


def conv_output_sizes(ops: Iterable[OpInfo]) -> dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, ...]]:
    """Output spatial sizes of convolutions, keyed by (input dims, weight dims), read off their backward ops.

    ``convolution_backward(grad_output, input, weight, ...)`` records the output's shape, which the forward
    op (whose stride and padding the profiler does not keep) lacks.
    """
    sizes = {}
    for op in ops:
        if "convolution_backward" in op.name and len(op.input_dims) >= 3 and len(op.input_dims[0]) >= 3:
            sizes[(op.input_dims[1], op.input_dims[2])] = op.input_dims[0][2:]
    return sizes


def _conv_work(op: OpInfo, tensors: Sequence[_Tensor], kernel_name: str,
               conv_outputs: Mapping[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, ...]]) -> OpWork | None:
    """Implicit GEMM: 2 * N * prod(output spatial) * K * C/groups * prod(filter); dgrad + wgrad twice that."""
    backward = "backward" in op.name
    first = 1 if backward else 0  # backward ops take grad_output first, then input and weight
    if len(tensors) < first + 2 or any(len(t.dims) < 3 for t in tensors[:first + 2]):
        return None
    x, weight = tensors[first], tensors[first + 1]
    if backward:
        spatial = tensors[0].dims[2:]
        written = x.nbytes + weight.nbytes
    else:
        default = x.dims[2:]  # stride 1, "same" padding: used when no backward op tells the output size
        spatial = default if "transpose" in op.name else conv_outputs.get((x.dims, weight.dims), default)
        written = float(x.dims[0] * weight.dims[0] * math.prod(spatial) * x.element_bytes)
    flops = 2.0 * x.dims[0] * math.prod(spatial) * weight.numel * (2 if backward else 1)
    return _tensor_work(flops, sum(t.nbytes for t in tensors) + written, tensors, kernel_name)


def _attention_work(op: OpInfo, tensors: Sequence[_Tensor], kernel_name: str) -> OpWork | None:
    """Forward 4 * B * H * S_q * S_kv * D (QK^T and PV), halved when causal; backward 2.5x the forward."""
    backward = "backward" in op.name
    first = 1 if backward else 0  # backward ops take grad_out first, then q, k, v
    if len(tensors) < first + 3 or any(len(t.dims) != 4 for t in tensors[first:first + 3]):
        return None
    q, k, v = tensors[first:first + 3]
    seq_axis = 1 if _SEQ_MAJOR_ATTENTION.match(op.name) else 2
    s_q, s_kv = q.dims[seq_axis], k.dims[seq_axis]
    rows = q.numel // max(q.dims[-1], 1)  # B * H * S_q
    flops = 2.0 * rows * s_kv * (q.dims[-1] + v.dims[-1]) * (CAUSAL_FRACTION if s_q == s_kv else 1.0)
    written = q.nbytes + k.nbytes + v.nbytes if backward else q.nbytes
    factor = ATTENTION_BACKWARD_FACTOR if backward else 1.0
    return _tensor_work(flops * factor, sum(t.nbytes for t in tensors) + written, tensors, kernel_name)


def _gather_traffic(op: OpInfo, tensors: Sequence[_Tensor]) -> tuple[int, float] | None:
    """Rows read and written by embedding lookups; a gather's index is taken as a broadcast view (not read)."""
    if len(tensors) < 2:
        return None
    table, index = tensors[0], tensors[1]
    if op.name == "aten::gather":
        return index.numel, 2.0 * index.numel * table.element_bytes
    elements = index.numel * (table.numel // max(table.dims[0], 1) if table.dims else 1)
    return elements, 2.0 * elements * table.element_bytes + index.nbytes


def _nll_loss_traffic(tensors: Sequence[_Tensor]) -> tuple[int, float] | None:
    """NLL loss touches one value per target: read target and value, write the result or gradient."""
    values = next((t for t in tensors if t.dtype in PRECISION), None)
    target = next((t for t in tensors if t.dtype in DTYPE_BYTES and t.dtype not in PRECISION), None)
    if values is None or target is None:
        return None
    return target.numel, float(target.numel * (target.element_bytes + 2 * values.element_bytes))


def _memory_traffic(op: OpInfo, tensors: Sequence[_Tensor]) -> tuple[int, float] | None:
    """(Elements processed, DRAM bytes) of a memory-bound op: operands read once, its result written once."""
    if op.name in ("aten::gather", "aten::embedding", "aten::index_select"):
        return _gather_traffic(op, tensors)
    if "nll_loss" in op.name:
        return _nll_loss_traffic(tensors)
    elements = max(t.numel for t in tensors)
    largest = max(t.nbytes for t in tensors)
    read = sum(t.nbytes for t in tensors)
    if op.name in _PASSES_OVER_LARGEST:
        return elements, _PASSES_OVER_LARGEST[op.name] * largest
    if op.name in _WRITE_ONLY_FIRST or op.name in _REDUCTIONS:
        return elements, read
    if op.name in _WRITTEN_INPUTS:
        return elements, read + sum(tensors[i].nbytes for i in _WRITTEN_INPUTS[op.name] if i < len(tensors))
    if op.name.endswith("_"):
        return elements, read + tensors[0].nbytes
    return elements, read + largest


def is_matmul(op_name: str) -> bool:
    """Whether the op is a matrix multiply that launches one tensor-core kernel per call."""
    return op_name in _MATMUL_FIRST_OPERAND or op_name == "aten::linear"


def op_work(op: OpInfo, category: Category, kernel_name: str = "",
            conv_outputs: Mapping[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, ...]] | None = None,
            ) -> OpWork | None:
    """Total work of one call of ``op`` (all the kernels it launches), or None when the shapes do not tell.

    Args:
        op: the launching op with its recorded input dims and dtypes.
        category: the kernel's category; picks the FLOPs per element of memory-bound ops.
        kernel_name: the name(s) of kernels the op launched, which can reveal tf32 math or the element size of
            a tensor list.
        conv_outputs: output spatial sizes by (input dims, weight dims), from :func:`conv_output_sizes`.
    """
    tensors = _tensors(op, kernel_name)
    if not tensors:
        return None
    if is_matmul(op.name):
        return _gemm_work(op, tensors, kernel_name)
    if "convolution" in op.name or re.match(r"^aten::conv\dd$", op.name):
        return _conv_work(op, tensors, kernel_name, conv_outputs or {})
    if _ATTENTION.match(op.name):
        return _attention_work(op, tensors, kernel_name)
    traffic = _memory_traffic(op, tensors)
    if traffic is None:
        return None
    elements, dram_bytes = traffic
    precision = "fp64" if any(t.dtype == "double" for t in tensors) else "fp32"
    return OpWork(FLOPS_PER_ELEMENT[category] * elements, dram_bytes, precision, False)
