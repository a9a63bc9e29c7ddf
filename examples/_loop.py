"""What the example training scripts share: their command line and their training loop.

Plain PyTorch, like the examples. They run as ``python examples/NAME.py`` (this folder first on ``sys.path``,
so they import this module as ``_loop``) or are imported as ``examples.NAME`` (as ``examples._loop``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn


def parse_args(description: str, sizes: Iterable[str], batch_unit: str, optimizer: str, lr: str,
               argv: list[str] | None = None) -> argparse.Namespace:
    """``--size --batch --steps --device --lr --seed --compile --ddp --fsdp``: ``batch_unit`` names what a batch holds
    (``images``), ``lr`` is the default learning rate of ``optimizer`` as the help shows it (``1e-4``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--size", choices=sorted(sizes), default="tiny", help="model size (default tiny)")
    parser.add_argument("--batch", type=int, help=f"{batch_unit} per step (default: the size's)")
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    parser.add_argument("--lr", type=float, default=float(lr), help=f"{optimizer} learning rate (default {lr})")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--compile", action="store_true", help="train the torch.compile'd model")
    parser.add_argument("--ddp", action="store_true",
                        help="data-parallel under torchrun (DistributedDataParallel: NCCL on GPUs, gloo on the CPU)")
    parser.add_argument("--fsdp", action="store_true", help="fully sharded data-parallel under torchrun (FSDP2 "
                        "fully_shard: NCCL on GPUs, gloo on the CPU)")
    args = parser.parse_args(argv)
    if args.ddp and args.fsdp:
        parser.error("--ddp and --fsdp exclude each other")
    return args


def train(optimizer: torch.optim.Optimizer, step_loss: Callable[[int], torch.Tensor], steps: int,
          device: torch.device) -> float:
    """Run ``steps`` optimizer steps on ``step_loss(step)``, under bf16 autocast on a GPU; the last loss."""
    loss = torch.zeros(())
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = step_loss(step)
        loss.backward()
        optimizer.step()
    return float(loss.item())


@contextlib.contextmanager
def training_device(args: argparse.Namespace) -> Iterator[torch.device]:
    """The device to train on: ``--device``; with ``--ddp`` or ``--fsdp`` (under torchrun) this worker's
    (``cuda:LOCAL_RANK``, or the CPU), inside a process group (NCCL on GPUs, gloo on the CPU) that ends with
    the block."""
    if not (args.ddp or args.fsdp):
        yield torch.device(args.device)
        return
    import torch.distributed as dist

    cuda = torch.device(args.device).type == "cuda"
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        yield device
    finally:
        dist.destroy_process_group()


def data_parallel(model: nn.Module, args: argparse.Namespace, device: torch.device,
                  blocks: Iterable[nn.Module] = ()) -> nn.Module:
    """``model`` wrapped in DistributedDataParallel with ``--ddp``; with ``--fsdp`` sharded in place with
    ``fully_shard``, each of ``blocks`` first, then the model (build the optimizer after this call); else itself."""
    if args.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (int(os.environ["WORLD_SIZE"]),))
        for block in blocks:
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    if not args.ddp:
        return model
    return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
