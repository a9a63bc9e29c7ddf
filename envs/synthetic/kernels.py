"""The kernels one transformer training step launches in PyTorch, with their FLOPs and DRAM bytes.

:func:`step_specs` lists, in launch order, what eager PyTorch (autocast, cuBLAS, cuDNN SDPA, fused AdamW)
runs for a pre-LN GPT/BERT block stack; :mod:`kdvfs.envs.synthetic.generator` prices each :class:`Spec` on a
GPU roofline.
The sequence follows the measured H200 Kineto trace ``h200/gpt3xl-24layer-b4`` (see
``docs/design/synthetic-traces.md``): under autocast every linear layer first casts its fp32 bias, weight and (if
fp32) input to the compute dtype and its backward casts the gradients back; cuBLAS GEMMs with a large output
are preceded by a workspace memset; bias gradients are column sums (a memset, then a reduction); the fused
optimizer is chunked by ``multi_tensor_apply``. FLOPs count multiply-adds as 2; bytes are compulsory DRAM
traffic (each operand read or written once, except where a kernel is known to make several passes).
"""

from __future__ import annotations

from kdvfs.common.config import ConfigError
from kdvfs.envs.synthetic.kernel_builder import (
    Eff,
    KernelBuilder,
    Spec,
    multi_tensor_launches,
    param_numels,
)
from kdvfs.envs.synthetic.moe import moe_bwd, moe_fwd
from kdvfs.envs.synthetic.workload import TransformerConfig
from kdvfs.envs.trace.trace import Category, Phase

SORT_PASSES = 8  # CUB onesweep passes over the int64 token ids in the embedding backward (64 bits / 8)
MAX_FEATURE_INDICES = 3072  # embedding backward uses the direct kernel up to this many indices
SOFTMAX_VOCAB_PASSES = 4  # log-softmax over vocab rows re-reads rows too long for shared memory
FUSED_ADAMW_BYTES = 28  # per fp32 parameter: param, exp_avg, exp_avg_sq read+write, grad read
# Foreach (non-fused) AdamW: (aten op, tensor lists, bytes per element, FLOPs per element), in launch order.
FOREACH_ADAMW = (
    ("_foreach_mul_", 1, 8, 1), ("_foreach_lerp_", 2, 12, 2), ("_foreach_mul_", 1, 8, 1),
    ("_foreach_addcmul_", 3, 12, 3), ("_foreach_sqrt", 2, 8, 1), ("_foreach_div_", 1, 8, 1),
    ("_foreach_add_", 1, 8, 1), ("_foreach_addcdiv_", 3, 16, 3),
)


def _linear_fwd(b: KernelBuilder, tag: str, n_in: int, n_out: int, input_fp32: bool) -> None:
    t, c = b.tokens, b.config
    b.cast(f"{tag}_bias", (n_out,), to_fp32=False)
    b.cast(f"{tag}_weight", (n_out, n_in), to_fp32=False)
    if input_fp32:
        b.cast(f"{tag}_input", (c.batch, c.seq, n_in), to_fp32=False)
    b.gemm(f"{tag}_fwd", "addmm", ((n_out,), (t, n_in), (n_in, n_out)), (t, n_out, n_in), bias=True)


def _linear_bwd(b: KernelBuilder, tag: str, n_in: int, n_out: int, input_fp32: bool) -> None:
    t, c = b.tokens, b.config
    b.gemm(f"{tag}_dgrad", "mm", ((t, n_out), (n_out, n_in)), (t, n_in, n_out))
    b.gemm(f"{tag}_wgrad", "mm", ((n_out, t), (t, n_in)), (n_out, n_in, t), wgrad=True)
    b.memset("sum", ((t, n_out),))
    b.add(f"reduce_{tag}_bias_grad", "sum", ((t, n_out),), Category.REDUCTION, Eff.REDUCE, t * n_out,
          (t + 1) * n_out * b.act)
    if input_fp32:
        b.cast(f"{tag}_input_grad", (c.batch, c.seq, n_in), to_fp32=True)
    b.cast(f"{tag}_weight_grad", (n_out, n_in), to_fp32=True)
    b.cast(f"{tag}_bias_grad", (n_out,), to_fp32=True)


def _layer_norm(b: KernelBuilder, backward: bool) -> None:
    """fp32 layer norm: one forward kernel; backward = input-gradient and gamma/beta-gradient kernels."""
    t, d = b.tokens, b.config.d_model
    shape = (b.config.batch, b.config.seq, d)
    parts = ((("bwd_input", 10, 12 * t * d + 8 * t), ("bwd_gamma_beta", 4, 8 * t * d + 8 * d)) if backward
             else (("fwd", 8, 8 * t * d + 8 * t + 8 * d),))
    op, dims = ("native_layer_norm_backward", (shape, shape, (d,), (d,))) if backward \
        else ("native_layer_norm", (shape, (d,), (d,)))
    for part, flops, nbytes in parts:
        b.add(f"layer_norm_{part}", op, dims, Category.NORM, Eff.NORM, flops * t * d, nbytes)


def _residual(b: KernelBuilder, backward: bool) -> None:
    """The residual add (fp32 + compute dtype, unrolled), or in backward the in-place fp32 gradient sum."""
    shape, name, op = (b.config.batch, b.config.seq, b.config.d_model), "add_residual", "add"
    eff, nbytes = (Eff.MIXED, 8 + b.act) if b.autocast else (Eff.VECTOR, 12)
    if backward:
        name, op, eff, nbytes = "add_residual_grad", "add_", Eff.VECTOR, 12
    b.pointwise(name, op, shape, Category.ELEMENTWISE, eff, nbytes, flops_per_element=1)


def _attention_fused(b: KernelBuilder, backward: bool) -> None:
    """cuDNN flash attention (fp32: memory-efficient attention), forward or backward, then the qkv cat."""
    c = b.config
    head = (c.batch, c.heads, c.seq, c.d_model // c.heads)
    t, d, a, lse = b.tokens, c.d_model, b.act, 4 * c.batch * c.heads * c.seq
    flops = 4.0 * c.batch * c.heads * c.seq * c.seq * head[3] * (0.5 if c.decoder else 1.0)
    kind = "flash_attention" if b.autocast else "efficient_attention"
    op = f"{'_cudnn' if b.autocast else '_efficient'}_attention_{'backward' if backward else 'forward'}"
    b.memset(op, (head, head, head))
    if not backward:
        b.add(f"{kind}_fwd", op, (head, head, head), Category.ATTENTION, Eff.FLASH_FWD, flops, 4 * t * d * a + lse,
              b.autocast)
        return
    b.add(f"{kind}_bwd_dot_do_o", op, (head, head), Category.ATTENTION, Eff.ATTN_AUX, 2 * t * d,
          2 * t * d * a + lse)
    b.add(f"{kind}_bwd", op, (head,) * 5, Category.ATTENTION, Eff.FLASH_BWD, 2.5 * flops,
          7 * t * d * a + 4 * t * d + lse, b.autocast)
    b.add(f"{kind}_bwd_convert_dq", op, (head,), Category.ATTENTION, Eff.ATTN_AUX, 0.0, t * d * (4 + a))
    b.pointwise("cat_qkv_grad", "cat", (3 * t * d,), Category.COPY_MEMSET, Eff.VECTOR, 2 * a, widest=a)


def _attention_unfused_fwd(b: KernelBuilder) -> None:
    """q @ k^T, scale, causal mask, softmax (fp32 under autocast), @ v, as a plain PyTorch block does it."""
    c = b.config
    bh, s, dh, a = c.batch * c.heads, c.seq, c.d_model // c.heads, b.act
    scores, head = (bh, s, s), (c.batch, c.heads, s, dh)
    for part in ("q", "k"):
        b.pointwise(f"copy_contiguous_{part}", "copy_", head, Category.COPY_MEMSET, Eff.VECTOR, 2 * a, a)
    b.gemm("scores_fwd", "bmm", ((bh, s, dh), (bh, dh, s)), (s, s, dh), batch=bh)
    b.pointwise("mul_scores_scale", "mul", scores, Category.ELEMENTWISE, Eff.VECTOR, 2 * a, a, 1)
    if c.decoder:
        b.pointwise("masked_fill_causal", "masked_fill", scores, Category.COPY_MEMSET, Eff.VECTOR, 2 * a + 1, a)
    b.cast("scores", scores, to_fp32=True)
    b.pointwise("softmax_scores_fwd", "_softmax", scores, Category.SOFTMAX_LOSS, Eff.SOFTMAX, 8, 4, 5)
    b.cast("probs", scores, to_fp32=False)
    b.pointwise("copy_contiguous_v", "copy_", head, Category.COPY_MEMSET, Eff.VECTOR, 2 * a, a)
    b.gemm("context_fwd", "bmm", ((bh, s, s), (bh, s, dh)), (s, dh, s), batch=bh)
    b.pointwise("copy_contiguous_context", "copy_", head, Category.COPY_MEMSET, Eff.VECTOR, 2 * a, a)


def _attention_unfused_bwd(b: KernelBuilder) -> None:
    c = b.config
    bh, s, dh, a = c.batch * c.heads, c.seq, c.d_model // c.heads, b.act
    scores, head = (bh, s, s), (c.batch, c.heads, s, dh)
    b.pointwise("copy_contiguous_context_grad", "copy_", head, Category.COPY_MEMSET, Eff.VECTOR, 2 * a, a)
    b.gemm("probs_grad", "bmm", ((bh, s, dh), (bh, dh, s)), (s, s, dh), batch=bh)
    b.gemm("value_grad", "bmm", ((bh, s, s), (bh, s, dh)), (s, dh, s), batch=bh)
    b.cast("probs_grad", scores, to_fp32=True)
    b.pointwise("softmax_scores_bwd", "_softmax_backward_data", scores, Category.SOFTMAX_LOSS, Eff.SOFTMAX, 12, 4, 3)
    b.cast("scores_grad", scores, to_fp32=False)
    if c.decoder:
        b.pointwise("masked_fill_causal_bwd", "masked_fill", scores, Category.COPY_MEMSET, Eff.VECTOR, 2 * a + 1, a)
    b.pointwise("mul_scores_scale_bwd", "mul", scores, Category.ELEMENTWISE, Eff.VECTOR, 2 * a, a, 1)
    b.gemm("query_grad", "bmm", ((bh, s, s), (bh, s, dh)), (s, dh, s), batch=bh)
    b.gemm("key_grad", "bmm", ((bh, s, s), (bh, s, dh)), (s, dh, s), batch=bh)
    b.pointwise("cat_qkv_grad", "cat", (3 * b.tokens * c.d_model,), Category.COPY_MEMSET, Eff.VECTOR, 2 * a, a)


def _layer_fwd(b: KernelBuilder) -> None:
    c = b.config
    d, f, a = c.d_model, c.ffn, b.act
    _layer_norm(b, backward=False)
    _linear_fwd(b, "qkv", d, 3 * d, input_fp32=True)
    if c.fused:
        _attention_fused(b, backward=False)
    else:
        _attention_unfused_fwd(b)
    _linear_fwd(b, "proj", d, d, input_fp32=False)
    _residual(b, backward=False)
    _layer_norm(b, backward=False)
    if c.experts:
        moe_fwd(b)
    else:
        _linear_fwd(b, "fc1", d, f, input_fp32=True)
        b.pointwise("gelu_fwd", "gelu", (c.batch, c.seq, f), Category.ELEMENTWISE, Eff.ACTIVATION, 2 * a, a, 20)
        _linear_fwd(b, "fc2", f, d, input_fp32=False)
    _residual(b, backward=False)


def _layer_bwd(b: KernelBuilder) -> None:
    c = b.config
    d, f, a, shape = c.d_model, c.ffn, b.act, (c.batch, c.seq, c.d_model)
    b.cast("fc2_output_grad", shape, to_fp32=False)
    if c.experts:
        moe_bwd(b)
    else:
        _linear_bwd(b, "fc2", f, d, input_fp32=False)
        b.pointwise("gelu_bwd", "gelu_backward", (c.batch, c.seq, f), Category.ELEMENTWISE, Eff.ACTIVATION, 3 * a, a,
                    30)
        _linear_bwd(b, "fc1", d, f, input_fp32=True)
    _layer_norm(b, backward=True)
    _residual(b, backward=True)
    b.cast("proj_output_grad", shape, to_fp32=False)
    _linear_bwd(b, "proj", d, d, input_fp32=False)
    if c.fused:
        _attention_fused(b, backward=True)
    else:
        _attention_unfused_bwd(b)
    _linear_bwd(b, "qkv", d, 3 * d, input_fp32=True)
    _layer_norm(b, backward=True)
    _residual(b, backward=True)


def _embedding_fwd(b: KernelBuilder) -> None:
    c = b.config
    t, d, s = b.tokens, c.d_model, c.seq
    b.add("embedding_fwd_tokens", "embedding", ((c.vocab, d), (c.batch, s)), Category.EMBEDDING, Eff.GATHER, 0.0,
          8 * t * d + 8 * t)
    b.add("arange_positions", "arange", ((s,),), Category.ELEMENTWISE, Eff.TINY, 0.0, 8 * s)
    b.add("embedding_fwd_positions", "embedding", ((s, d), (s,)), Category.EMBEDDING, Eff.GATHER, 0.0, 8 * s * d)
    b.pointwise("add_positions", "add", (c.batch, s, d), Category.ELEMENTWISE, Eff.MIXED, 8 + 4 * s / t)


def _embedding_table_bwd(b: KernelBuilder, tag: str, rows: int, indices: int) -> None:
    """embedding_dense_backward: direct kernel for few indices, else a CUB radix sort and segment sums."""
    d, op, dims = b.config.d_model, "embedding_dense_backward", ((indices, b.config.d_model), (indices,))
    if indices > MAX_FEATURE_INDICES:
        b.add("arange_sort_values", "arange", ((indices,),), Category.ELEMENTWISE, Eff.TINY, 0.0, 8 * indices)
        b.memset(op, dims)
        b.memset(op, dims)
        b.add("embedding_bwd_sort_histogram", op, dims, Category.EMBEDDING, Eff.SORT, 0.0, 8 * indices)
        b.add("embedding_bwd_sort_exclusive_sum", op, dims, Category.EMBEDDING, Eff.TINY, 0.0, 8 * 256 * SORT_PASSES)
        for _ in range(SORT_PASSES):
            b.memset(op, dims)
            b.add("embedding_bwd_sort_onesweep", op, dims, Category.EMBEDDING, Eff.SORT, 0.0, 32 * indices)
    b.pointwise(f"fill_zero_{tag}_grad", "fill_", (rows, d), Category.COPY_MEMSET, Eff.VECTOR, 4)
    if indices <= MAX_FEATURE_INDICES:
        b.add("embedding_bwd_feature", op, dims, Category.EMBEDDING, Eff.SEGMENT, indices * d,
              8 * indices * d + 8 * indices)
        return
    for step in ("compact_init", "unique_by_key", "partials_per_segment", "scan_init", "scan",
                 "num_partial_segments", "partial_segment_offset"):
        b.add(f"embedding_bwd_{step}", op, dims, Category.EMBEDDING,
              Eff.SORT if step == "unique_by_key" else Eff.TINY, 0.0, 16 * indices)
    for step in ("compute_grad_weight", "sum_and_scatter"):  # gradient rows in; per-segment partial sums out
        b.add(f"embedding_bwd_{step}", op, dims, Category.EMBEDDING, Eff.SEGMENT, indices * d, 4 * indices * d)


def _head_fwd(b: KernelBuilder) -> None:
    """Final layer norm, LM head GEMM, cross entropy (fp32 log-softmax + NLL), and the loss gradient seed."""
    c = b.config
    t, d, v = b.tokens, c.d_model, c.vocab
    _layer_norm(b, backward=False)
    b.cast("lm_head_weight", (v, d), to_fp32=False)
    b.cast("lm_head_input", (c.batch, c.seq, d), to_fp32=False)
    b.gemm("lm_head_fwd", "mm", ((t, d), (d, v)), (t, v, d))
    b.cast("logits", (t, v), to_fp32=True)
    b.add("log_softmax_fwd", "_log_softmax", ((t, v),), Category.SOFTMAX_LOSS, Eff.SOFTMAX, 4 * t * v,
          SOFTMAX_VOCAB_PASSES * 4 * t * v)
    b.add("nll_loss_fwd", "nll_loss_forward", ((t, v), (t,)), Category.SOFTMAX_LOSS, Eff.SERIAL, t, 12 * t)
    if c.precision == "fp16":
        b.add("mul_grad_scaler_scale", "mul", ((), ()), Category.ELEMENTWISE, Eff.TINY, 1, 8)
    b.add("fill_ones_grad_seed", "fill_", ((), ()), Category.COPY_MEMSET, Eff.TINY, 0.0, 4)


def _head_bwd(b: KernelBuilder) -> None:
    c = b.config
    t, d, v = b.tokens, c.d_model, c.vocab
    b.pointwise("fill_zero_logits_grad", "fill_", (t, v), Category.COPY_MEMSET, Eff.VECTOR, 4)
    b.add("nll_loss_bwd", "nll_loss_backward", ((), (t, v), (t,)), Category.SOFTMAX_LOSS, Eff.SERIAL, t, 12 * t)
    b.add("log_softmax_bwd", "_log_softmax_backward_data", ((t, v), (t, v)), Category.SOFTMAX_LOSS, Eff.SOFTMAX,
          3 * t * v, SOFTMAX_VOCAB_PASSES * 4 * t * v)
    b.cast("logits_grad", (t, v), to_fp32=False)
    b.gemm("lm_head_dgrad", "mm", ((t, v), (v, d)), (t, d, v))
    b.gemm("lm_head_wgrad", "mm", ((v, t), (t, d)), (v, d, t), wgrad=True)
    b.cast("lm_head_input_grad", (c.batch, c.seq, d), to_fp32=True)
    b.cast("lm_head_weight_grad", (v, d), to_fp32=True)
    _layer_norm(b, backward=True)


def _embedding_bwd(b: KernelBuilder) -> None:
    c = b.config
    if c.batch > 1:
        b.add("reduce_position_grad", "sum", ((c.batch, c.seq, c.d_model),), Category.REDUCTION, Eff.REDUCE,
              b.tokens * c.d_model, 4 * (b.tokens + c.seq) * c.d_model)
    _embedding_table_bwd(b, "position", c.seq, c.seq)
    _embedding_table_bwd(b, "token", c.vocab, b.tokens)


def _optimizer(b: KernelBuilder) -> None:
    """AdamW over every parameter (fp32 master weights), plus GradScaler's kernels for fp16."""
    c, numels = b.config, param_numels(b.config)
    if c.precision == "fp16":
        for n in multi_tensor_launches(numels, 1):
            b.add("amp_foreach_non_finite_check_and_unscale", "_amp_foreach_non_finite_check_and_unscale_", (),
                  Category.OPTIMIZER, Eff.OPTIMIZER, n, 8 * n)
    if c.fused:
        for n in multi_tensor_launches([1] * len(numels), 1):
            b.add("foreach_add_step", "_foreach_add_", ((), ()), Category.OPTIMIZER, Eff.TINY, n, 8 * n)
        for n in multi_tensor_launches(numels, 4):
            b.add("fused_adamw", "_fused_adamw_", (), Category.OPTIMIZER, Eff.OPTIMIZER, 16 * n, FUSED_ADAMW_BYTES * n)
    else:
        for op, depth, nbytes, flops in FOREACH_ADAMW:
            for n in multi_tensor_launches(numels, depth):
                b.add(f"foreach_adamw{op.removeprefix('_foreach')}", op, (), Category.OPTIMIZER, Eff.OPTIMIZER,
                      flops * n, nbytes * n)
    if c.precision == "fp16":
        b.add("amp_update_scale", "_amp_update_scale_", (), Category.OPTIMIZER, Eff.TINY, 4, 16)


def _cross_attention(b: KernelBuilder, source_seq: int, backward: bool) -> None:
    """A decoder layer's cross-attention over ``source_seq`` encoder positions (fused, like the self-attention's):
    the key/value projection of the encoder states (linear in the encoder's tokens) and the attention kernels
    (``batch * heads * seq * source_seq`` scores), forward or backward."""
    c = b.config
    dh, a, source = c.d_model // c.heads, b.act, c.batch * source_seq
    kv, q = (c.batch, c.heads, source_seq, dh), (c.batch, c.heads, c.seq, dh)
    flops = 4.0 * c.batch * c.heads * c.seq * source_seq * dh
    nbytes = (2 * b.tokens + 2 * source) * c.d_model * a
    op = f"_efficient_attention_{'backward' if backward else 'forward'}"
    if not backward:
        b.gemm("cross_kv_fwd", "addmm", ((2 * c.d_model,), (source, c.d_model), (c.d_model, 2 * c.d_model)),
               (source, 2 * c.d_model, c.d_model), bias=True)
        b.add("cross_attention_fwd", op, (q, kv, kv), Category.ATTENTION, Eff.FLASH_FWD, flops, nbytes, b.autocast)
        return
    b.add("cross_attention_bwd", op, (q, kv, kv, q), Category.ATTENTION, Eff.FLASH_BWD, 2.5 * flops, 2 * nbytes,
          b.autocast)
    b.gemm("cross_kv_dgrad", "mm", ((source, 2 * c.d_model), (2 * c.d_model, c.d_model)),
           (source, c.d_model, 2 * c.d_model))
    b.gemm("cross_kv_wgrad", "mm", ((2 * c.d_model, source), (source, c.d_model)), (2 * c.d_model, c.d_model, source),
           wgrad=True)


def encoder_decoder_specs(encoder: TransformerConfig, decoder: TransformerConfig) -> list[Spec]:
    """Every activity of one encoder-decoder training step, in launch order: the encoder's forward (``encoder``:
    its embedding and blocks, bidirectional), the decoder's (``decoder``: blocks each followed by a
    cross-attention over the encoder's ``encoder.seq`` positions, then the head and loss), the backward in
    reverse, and AdamW over both stacks. Kernels follow the encoder's tokens (and their square in attention),
    the decoder's, and their product in cross-attention. Both configs must share ``batch`` and ``precision``."""
    if (encoder.batch, encoder.precision) != (decoder.batch, decoder.precision):
        raise ConfigError(f"encoder {encoder.name!r} and decoder {decoder.name!r}: an encoder-decoder's two stacks "
                          "share batch and precision")
    enc, dec = KernelBuilder(encoder), KernelBuilder(decoder)
    _embedding_fwd(enc)
    for _ in range(encoder.layers):
        _layer_fwd(enc)
    _embedding_fwd(dec)
    for _ in range(decoder.layers):
        _layer_fwd(dec)
        _cross_attention(dec, encoder.seq, backward=False)
    _head_fwd(dec)
    enc.phase = dec.phase = Phase.BACKWARD
    _head_bwd(dec)
    for _ in range(decoder.layers):
        _cross_attention(dec, encoder.seq, backward=True)
        _layer_bwd(dec)
    _embedding_bwd(dec)
    for _ in range(encoder.layers):
        _layer_bwd(enc)
    _embedding_bwd(enc)
    enc.phase = dec.phase = Phase.OPTIMIZER
    _optimizer(enc)
    _optimizer(dec)
    def of(builder: KernelBuilder, phase: Phase) -> list[Spec]:
        return [s for s in builder.specs if s.phase is phase]

    return [*of(enc, Phase.FORWARD), *of(dec, Phase.FORWARD), *of(dec, Phase.BACKWARD), *of(enc, Phase.BACKWARD),
            *of(enc, Phase.OPTIMIZER), *of(dec, Phase.OPTIMIZER)]


def step_specs(config: TransformerConfig) -> list[Spec]:
    """Every activity of one training step (forward, backward, optimizer), in launch order."""
    b = KernelBuilder(config)
    _embedding_fwd(b)
    for _ in range(config.layers):
        _layer_fwd(b)
    _head_fwd(b)
    b.phase = Phase.BACKWARD
    _head_bwd(b)
    for _ in range(config.layers):
        _layer_bwd(b)
    _embedding_bwd(b)
    b.phase = Phase.OPTIMIZER
    _optimizer(b)
    return b.specs
