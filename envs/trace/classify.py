"""Classify GPU kernels into categories from their names and the framework ops that launched them.

Rules are tried in order; the first whose pattern matches the kernel name or the launching op wins.
The order encodes precedence: a memset launched by ``aten::mm`` is copy/memset, a layer-norm kernel
launched inside the optimizer annotation is still optimizer work, a GEMM kernel inside a convolution is
gemm.
"""

from __future__ import annotations

import re

from kdvfs.envs.trace.trace import Category, Kind

# (category, pattern over the lower-cased kernel name, pattern over the lower-cased op name)
_RULES: tuple[tuple[Category, str | None, str | None], ...] = (
    (Category.COMMUNICATION, r"nccl|all_?reduce|all_?gather|reduce_?scatter|sendrecv",
     r"^c10d::|^nccl:|all_reduce|all_gather|reduce_scatter"),
    (Category.OPTIMIZER, r"adam|fused_sgd|lamb_|adagrad|rmsprop|lion_",
     r"_fused_adam|_fused_sgd|_foreach_|optimizer"),
    (Category.ATTENTION, r"flash|fmha|sdpa|attention|attn|compute_dot_do_o|convert_dq_to",
     r"attention|scaled_dot_product|flash"),
    (Category.GEMM, r"gemm|nvjet|cutlass|xmma|cublas|sm\d\d_.*(?:fprop|dgrad|wgrad)|wgmma|hmma|splitkreduce"
     r"|implicit_convolve|conv2d|winograd|fft2d",
     r"^aten::(?:mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|.*convolution.*)$"),
    (Category.EMBEDDING, r"embedding|index_select|indexselect|gather_kernel|embedding_backward",
     r"embedding|index_select|^aten::gather$"),
    (Category.NORM, r"layer_?norm|batch_?norm|group_?norm|rms_?norm|instance_?norm|welford",
     r"layer_norm|batch_norm|group_norm|rms_norm|instance_norm"),
    (Category.SOFTMAX_LOSS, r"softmax|nll_loss|cross_entropy|_loss", r"softmax|nll_loss|cross_entropy|_loss"),
    (Category.REDUCTION, r"reduce_kernel|reduce|radix_sort|cub::|scan|argmax|topk",
     r"^aten::(?:sum|mean|max|min|amax|amin|norm|linalg_vector_norm|var|std|prod|argmax|cumsum|sort|topk)"),
    (Category.COPY_MEMSET, r"copy|memcpy|memset|fill|cat_?array|transpose|permute|padding",
     r"^aten::(?:copy_|fill_|zero_|zeros|ones|clone|contiguous|cat|stack|to|_to_copy|empty_like)$"),
    (Category.ELEMENTWISE, r"elementwise|vectorized|unrolled|functor|gelu|relu|silu|dropout|sigmoid|tanh",
     r"^aten::"),
)
_COMPILED = tuple(
    (category, re.compile(name) if name else None, re.compile(op) if op else None)
    for category, name, op in _RULES
)


def classify(name: str, op_name: str | None, kind: Kind = Kind.KERNEL, in_optimizer: bool = False) -> Category:
    """Category of a GPU activity.

    Args:
        name: the kernel name from the profiler (any mangling).
        op_name: the framework op that launched it (e.g. ``"aten::addmm"``), or None when unknown.
        kind: memsets and memcpys are always copy/memset.
        in_optimizer: the kernel was launched inside an ``Optimizer.step`` annotation.
    """
    if kind is not Kind.KERNEL:
        return Category.COPY_MEMSET
    if in_optimizer:
        return Category.OPTIMIZER
    lowered_name, lowered_op = name.lower(), (op_name or "").lower()
    for category, name_pattern, op_pattern in _COMPILED:
        if name_pattern is not None and name_pattern.search(lowered_name):
            return category
        if op_pattern is not None and lowered_op and op_pattern.search(lowered_op):
            return category
    return Category.OTHER
