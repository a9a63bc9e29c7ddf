"""The kernels of a mixture-of-experts MLP (Mixtral-style, eager PyTorch) in one training step.

A router GEMM scores every token against the experts; a softmax and a top-k pick ``top_k`` experts per token;
the routing mask goes to the host (``nonzero`` over the experts hit: a device-to-host copy the CPU waits for,
so the next launch comes late), and each expert gathers its tokens (``index``), runs its MLP on them (GEMMs
of a small, routing-dependent M), scales by the routing weight and adds the result back (``index_add_``).
The backward pass mirrors it: gradients are gathered per expert, the MLP's GEMMs run backward, and the
token gradients are scattered back with a sort-based ``index_put_``. Routing is taken as uniform (every
expert gets ``tokens * top_k / experts`` tokens). FLOPs count multiply-adds as 2; bytes are compulsory DRAM
traffic, as in :mod:`kdvfs.envs.synthetic.kernels`.
"""

from __future__ import annotations

import math

from kdvfs.envs.synthetic.kernel_builder import Eff, KernelBuilder
from kdvfs.envs.trace.trace import Category

INDEX_BYTES = 8  # int64 token indices
SCATTER_SORT_PASSES = 2  # radix-sort passes of index_put_ with accumulate over a few thousand int64 indices


def expert_tokens(b: KernelBuilder) -> int:
    """Tokens each expert processes under uniform routing."""
    return math.ceil(b.tokens * b.config.top_k / b.config.experts)


def _router_fwd(b: KernelBuilder) -> None:
    c, t, a = b.config, b.tokens, b.act
    e, k = c.experts, c.top_k
    b.cast("router_weight", (e, c.d_model), to_fp32=False)
    b.gemm("router_fwd", "mm", ((t, c.d_model), (c.d_model, e)), (t, e, c.d_model))
    b.add("router_softmax", "_softmax", ((t, e),), Category.SOFTMAX_LOSS, Eff.SOFTMAX, 5 * t * e, t * e * (a + 4))
    b.add("router_topk", "topk", ((t, e),), Category.REDUCTION, Eff.SORT, t * e, t * e * 4 + t * k * 12)
    b.add("router_normalise", "div_", ((t, k), (t, 1)), Category.ELEMENTWISE, Eff.TINY, t * k, 12 * t * k)
    b.add("router_one_hot", "one_hot", ((t, k),), Category.ELEMENTWISE, Eff.TINY, 0.0, INDEX_BYTES * t * k * (e + 1))
    b.host_sync("nonzero", INDEX_BYTES * e)


def _expert_fwd(b: KernelBuilder, tokens: int) -> None:
    c, a, t = b.config, b.act, b.tokens
    d, f = c.d_model, c.ffn
    b.add("expert_where", "nonzero", ((c.top_k, t),), Category.ELEMENTWISE, Eff.TINY, 0.0, INDEX_BYTES * c.top_k * t)
    b.add("expert_gather_kernel_tokens", "index", ((t, d), (tokens,)), Category.EMBEDDING, Eff.GATHER, 0.0,
          2 * tokens * d * a + INDEX_BYTES * tokens)
    for tag, n_in, n_out in (("expert_fc1", d, f), ("expert_fc2", f, d)):
        b.cast(f"{tag}_bias", (n_out,), to_fp32=False)
        b.cast(f"{tag}_weight", (n_out, n_in), to_fp32=False)
        b.gemm(f"{tag}_fwd", "addmm", ((n_out,), (tokens, n_in), (n_in, n_out)), (tokens, n_out, n_in), bias=True)
        if tag == "expert_fc1":
            b.pointwise("expert_gelu_fwd", "gelu", (tokens, f), Category.ELEMENTWISE, Eff.ACTIVATION, 2 * a, a, 20)
    b.pointwise("expert_scale_by_weight", "mul", (tokens, d), Category.ELEMENTWISE, Eff.VECTOR, 2 * a, a, 1)
    b.add("expert_index_add", "index_add_", ((t, d), (tokens,), (tokens, d)), Category.ELEMENTWISE, Eff.GATHER,
          tokens * d, 3 * tokens * d * a + INDEX_BYTES * tokens)


def moe_fwd(b: KernelBuilder) -> None:
    """The mixture-of-experts MLP forward: router, routing sync, then every expert on its tokens."""
    c = b.config
    b.pointwise("fill_zero_moe_output", "zeros", (b.tokens, c.d_model), Category.COPY_MEMSET, Eff.VECTOR, b.act)
    _router_fwd(b)
    for _ in range(c.experts):
        _expert_fwd(b, expert_tokens(b))


def _expert_linear_bwd(b: KernelBuilder, tag: str, tokens: int, n_in: int, n_out: int) -> None:
    b.gemm(f"{tag}_dgrad", "mm", ((tokens, n_out), (n_out, n_in)), (tokens, n_in, n_out))
    b.gemm(f"{tag}_wgrad", "mm", ((n_out, tokens), (tokens, n_in)), (n_out, n_in, tokens), wgrad=True)
    b.add(f"reduce_{tag}_bias_grad", "sum", ((tokens, n_out),), Category.REDUCTION, Eff.REDUCE, tokens * n_out,
          (tokens + 1) * n_out * b.act)
    b.cast(f"{tag}_weight_grad", (n_out, n_in), to_fp32=True)
    b.cast(f"{tag}_bias_grad", (n_out,), to_fp32=True)


def _expert_bwd(b: KernelBuilder, tokens: int) -> None:
    c, a, t = b.config, b.act, b.tokens
    d, f = c.d_model, c.ffn
    b.add("expert_gather_kernel_output_grad", "index", ((t, d), (tokens,)), Category.EMBEDDING, Eff.GATHER, 0.0,
          2 * tokens * d * a + INDEX_BYTES * tokens)
    b.pointwise("expert_scale_grad", "mul", (tokens, d), Category.ELEMENTWISE, Eff.VECTOR, 3 * a, a, 1)
    b.add("reduce_routing_weight_grad", "sum", ((tokens, d),), Category.REDUCTION, Eff.REDUCE, tokens * d,
          tokens * d * a)
    _expert_linear_bwd(b, "expert_fc2", tokens, f, d)
    b.pointwise("expert_gelu_bwd", "gelu_backward", (tokens, f), Category.ELEMENTWISE, Eff.ACTIVATION, 3 * a, a, 30)
    _expert_linear_bwd(b, "expert_fc1", tokens, d, f)
    dims = ((t, d), (tokens,), (tokens, d))
    for _ in range(SCATTER_SORT_PASSES):
        b.add("expert_scatter_radix_sort", "_index_put_impl_", dims, Category.REDUCTION, Eff.SORT, 0.0,
              4 * INDEX_BYTES * tokens)
    b.add("expert_scatter_input_grad", "_index_put_impl_", dims, Category.ELEMENTWISE, Eff.SEGMENT, tokens * d,
          3 * tokens * d * a + INDEX_BYTES * tokens)


def moe_bwd(b: KernelBuilder) -> None:
    """The mixture-of-experts MLP backward: every expert, the routing sync, then the router."""
    c, t, a = b.config, b.tokens, b.act
    e = c.experts
    b.pointwise("fill_zero_moe_input_grad", "zeros", (t, c.d_model), Category.COPY_MEMSET, Eff.VECTOR, a)
    b.host_sync("nonzero", INDEX_BYTES * e)
    for _ in range(e):
        _expert_bwd(b, expert_tokens(b))
    b.add("router_grad_scatter", "scatter", ((t, e), (t, c.top_k)), Category.ELEMENTWISE, Eff.TINY, 0.0,
          t * e * 4 + t * c.top_k * 12)
    b.add("router_softmax_bwd", "_softmax_backward_data", ((t, e), (t, e)), Category.SOFTMAX_LOSS, Eff.SOFTMAX,
          3 * t * e, 3 * t * e * 4)
    b.gemm("router_dgrad", "mm", ((t, e), (e, c.d_model)), (t, c.d_model, e))
    b.gemm("router_wgrad", "mm", ((e, t), (t, c.d_model)), (e, c.d_model, t), wgrad=True)
    b.cast("router_weight_grad", (e, c.d_model), to_fp32=True)
