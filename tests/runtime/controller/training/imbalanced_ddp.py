"""A gloo DDP job (run under torchrun) whose rank 1 does extra work each step, so the other ranks wait at
the gradient all-reduce: the artificial slack of the torchrun tests. ``python imbalanced_ddp.py STEPS``."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn

EXTRA_MATMULS = 120  # rank 1's extra work per step, outside the model (no gradient)


def main(steps: int) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs, weight = torch.randn(64, 256), torch.randn(256, 256) / 16
    extra = EXTRA_MATMULS if dist.get_rank() == 1 else 0
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            hidden = inputs
            for _ in range(extra):
                hidden = torch.tanh(hidden @ weight)
        model(inputs).square().mean().backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]))
