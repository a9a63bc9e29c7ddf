"""One transformer training workload (presets in ``configs/workloads/*.yaml``): its sizes, precision and kernels."""

from __future__ import annotations

from dataclasses import dataclass

from kdvfs.common.config import ConfigError

PRECISIONS = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class TransformerConfig:
    """One transformer training workload. Sizes are element counts; the step is one optimizer update.

    Attributes:
        name: workload label (the preset's file name).
        layers: transformer blocks.
        d_model: hidden size.
        heads: attention heads; must divide ``d_model`` (head dim = d_model / heads).
        ffn: MLP hidden size (GPT uses 4 * d_model; always given explicitly).
        seq: tokens per sequence (also the number of learned positions).
        batch: sequences per step.
        vocab: vocabulary size (rows of the token embedding and of the untied LM head).
        precision: ``"bf16"``/``"fp16"``: autocast with fp32 master weights (fp16 adds GradScaler kernels);
            ``"fp32"``: no autocast, fp32 GEMMs on CUDA cores.
        fused: True: fused (cuDNN flash) attention and fused AdamW; False: bmm + softmax + bmm attention and
            foreach AdamW.
        decoder: True: causal self-attention (GPT); False: bidirectional (BERT-like encoder). Both end in a
            vocab-sized head with cross entropy over every position.
        experts: 0 for a dense MLP; else the MLP is a mixture of this many experts (each an ``ffn``-wide MLP)
            behind a router (Mixtral-style, :mod:`kdvfs.envs.synthetic.moe`).
        top_k: experts each token is routed to (used when ``experts`` > 0).
    """

    name: str
    layers: int
    d_model: int
    heads: int
    ffn: int
    seq: int
    batch: int
    vocab: int
    precision: str = "bf16"
    fused: bool = True
    decoder: bool = True
    experts: int = 0
    top_k: int = 2

    def __post_init__(self) -> None:
        for label in ("layers", "d_model", "heads", "ffn", "seq", "batch", "vocab"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"workload {self.name!r}: {label}={value!r} must be a positive integer")
        if self.d_model % self.heads:
            raise ConfigError(f"workload {self.name!r}: heads={self.heads} does not divide d_model={self.d_model}; "
                              "choose heads so that d_model % heads == 0")
        if self.experts and not (self.experts >= 2 and 1 <= self.top_k <= self.experts):
            raise ConfigError(f"workload {self.name!r}: experts={self.experts!r}, top_k={self.top_k!r}: need experts 0 "
                              "(dense) or >= 2 with 1 <= top_k <= experts")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"workload {self.name!r}: precision={self.precision!r} is not one of "
                              f"{list(PRECISIONS)}")

    def summary(self) -> str:
        """A one-line description, e.g. ``gpt3xl L24 d2048 h16 ffn8192 s2048 b4 v50304 bf16 fused decoder``
        (``moe8x top2`` appended for a mixture of experts)."""
        return (f"{self.name} L{self.layers} d{self.d_model} h{self.heads} ffn{self.ffn} s{self.seq} b{self.batch} "
                f"v{self.vocab} {self.precision} {'fused' if self.fused else 'unfused'} "
                f"{'decoder' if self.decoder else 'encoder'}"
                + (f" moe{self.experts}x top{self.top_k}" if self.experts else ""))
