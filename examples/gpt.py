"""A GPT-style language model trained on synthetic tokens: plain PyTorch, an example for ``kdvfs capture``.

    python examples/gpt.py --size tiny --steps 20 --device cpu
    kdvfs capture -o gpt3xl.trace.json -- python examples/gpt.py --size gpt3xl --batch 4 --steps 200

Sizes: ``tiny`` (2 layers, d=64: seconds on a CPU), ``gpt2s`` (GPT-2 small: 12 layers, d=768, 12 heads,
sequence 1024) and ``gpt3xl`` (GPT-3 XL: 24 layers, d=2048, 16 heads, sequence 2048); vocabulary 50304
for both real sizes, output layer tied to the token embedding. On a GPU it trains with bf16 autocast,
fused AdamW and ``scaled_dot_product_attention``; on a CPU in fp32 with the default AdamW. ``--ddp`` trains
data-parallel under torchrun: ``torchrun --nproc-per-node 2 examples/gpt.py --size tiny --device cpu --ddp``
(gloo on the CPU, NCCL on GPUs; keep ``NCCL_NVLS_ENABLE=0`` there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

if __package__:  # imported as ``examples.gpt``
    from ._loop import data_parallel, parse_args, train, training_device
else:  # run as a script: this folder is first on sys.path
    from _loop import data_parallel, parse_args, train, training_device


@dataclass(frozen=True)
class Size:
    """Shape of the model and of one sequence, and the default batch."""

    layers: int
    d_model: int
    heads: int
    seq: int
    vocab: int
    batch: int


SIZES = {
    "tiny": Size(layers=2, d_model=64, heads=4, seq=32, vocab=256, batch=2),
    "gpt2s": Size(layers=12, d_model=768, heads=12, seq=1024, vocab=50304, batch=16),
    "gpt3xl": Size(layers=24, d_model=2048, heads=16, seq=2048, vocab=50304, batch=4),
}


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4x GELU MLP, each with a residual."""

    def __init__(self, size: Size) -> None:
        super().__init__()
        d = size.d_model
        self.heads = size.heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        q, k, v = (z.view(batch, seq, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(d, dim=2))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Token and position embeddings, transformer blocks, final norm, output tied to the token embedding."""

    def __init__(self, size: Size) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(size.vocab, size.d_model), nn.Embedding(size.seq, size.d_model)
        self.blocks = nn.ModuleList(Block(size) for _ in range(size.layers))
        self.ln_f = nn.LayerNorm(size.d_model)
        for embedding in (self.wte, self.wpe):
            nn.init.normal_(embedding.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main(argv: list[str] | None = None) -> float:
    """Train for ``--steps`` steps; returns the last loss."""
    args = parse_args(__doc__.split("\n")[0], SIZES, "sequences", "AdamW", "1e-4", argv)
    size = SIZES[args.size]
    torch.manual_seed(args.seed)
    with training_device(args) as device:
        with device:
            model = GPT(size)
        parallel = data_parallel(model, args, device, model.blocks)
        optimizer = torch.optim.AdamW(parallel.parameters(), lr=args.lr, fused=device.type == "cuda")
        batch = args.batch or size.batch
        data = [torch.randint(size.vocab, (2, batch, size.seq), device=device) for _ in range(4)]
        forward = torch.compile(parallel) if args.compile else parallel
        loss = train(optimizer, lambda step: forward(*data[step % len(data)]), args.steps, device)
    print(f"gpt {args.size}: {args.steps} steps of batch {batch} x {size.seq} on {device}, loss {loss:.3f}")
    return loss


if __name__ == "__main__":
    main()
