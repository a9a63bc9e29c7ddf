"""A ResNet-50-like image classifier trained on synthetic images: plain PyTorch (no torchvision), an
example for ``kdvfs capture``.

    python examples/vision.py --size tiny --steps 20 --device cpu
    kdvfs capture -o resnet50.trace.json -- python examples/vision.py --size resnet50 --batch 128 --steps 400

Sizes: ``tiny`` (one bottleneck per stage, 8-64 channels, 32 px: seconds on a CPU) and ``resnet50``
(bottleneck stages of 3, 4, 6, 3 blocks, 64-512 channels x4 expansion, 224 px, 1000 classes). Channels-last
tensors, SGD with momentum and weight decay; bf16 autocast on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

if __package__:  # imported as ``examples.vision``
    from ._loop import data_parallel, parse_args, train, training_device
else:  # run as a script: this folder is first on sys.path
    from _loop import data_parallel, parse_args, train, training_device


@dataclass(frozen=True)
class Size:
    """Blocks and base width of each stage, image side, classes and the default batch."""

    blocks: tuple[int, int, int, int]
    widths: tuple[int, int, int, int]
    image: int
    classes: int
    batch: int


SIZES = {
    "tiny": Size(blocks=(1, 1, 1, 1), widths=(8, 16, 32, 64), image=32, classes=10, batch=4),
    "resnet50": Size(blocks=(3, 4, 6, 3), widths=(64, 128, 256, 512), image=224, classes=1000, batch=128),
}
EXPANSION = 4


def conv_bn(channels_in: int, channels_out: int, kernel: int, stride: int = 1) -> nn.Sequential:
    """Convolution without bias followed by batch norm."""
    return nn.Sequential(nn.Conv2d(channels_in, channels_out, kernel, stride, kernel // 2, bias=False),
                         nn.BatchNorm2d(channels_out))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand; a projected shortcut where the shape changes."""

    def __init__(self, channels_in: int, width: int, stride: int) -> None:
        super().__init__()
        channels_out = width * EXPANSION
        self.reduce, self.conv = conv_bn(channels_in, width, 1), conv_bn(width, width, 3, stride)
        self.expand = conv_bn(width, channels_out, 1)
        same = stride == 1 and channels_in == channels_out
        self.shortcut = nn.Identity() if same else conv_bn(channels_in, channels_out, 1, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.expand(F.relu(self.conv(F.relu(self.reduce(x)))))
        return F.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    """7x7 stem and max pool, four bottleneck stages, global average pool, linear classifier."""

    def __init__(self, size: Size) -> None:
        super().__init__()
        self.stem = conv_bn(3, size.widths[0], 7, 2)
        layers: list[nn.Module] = []
        channels = size.widths[0]
        for stage, (blocks, width) in enumerate(zip(size.blocks, size.widths, strict=True)):
            for block in range(blocks):
                layers.append(Bottleneck(channels, width, 2 if block == 0 and stage > 0 else 1))
                channels = width * EXPANSION
        self.stages = nn.Sequential(*layers)
        self.head = nn.Linear(channels, size.classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.stem(images)), 3, 2, 1)
        x = self.stages(x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main(argv: list[str] | None = None) -> float:
    """Train for ``--steps`` steps; returns the last loss."""
    args = parse_args(__doc__.split("\n")[0], SIZES, "images", "SGD", "0.1", argv)
    size = SIZES[args.size]
    torch.manual_seed(args.seed)
    with training_device(args) as device:
        with device:
            model = ResNet(size).to(memory_format=torch.channels_last)
        parallel = data_parallel(model, args, device)
        optimizer = torch.optim.SGD(parallel.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
        batch = args.batch or size.batch
        images = torch.randn(batch, 3, size.image, size.image, device=device).to(memory_format=torch.channels_last)
        labels = torch.randint(size.classes, (batch,), device=device)
        forward = torch.compile(parallel) if args.compile else parallel
        loss = train(optimizer, lambda step: F.cross_entropy(forward(images), labels), args.steps, device)
    print(f"vision {args.size}: {args.steps} steps of batch {batch} at {size.image} px on {device}, loss {loss:.3f}")
    return loss


if __name__ == "__main__":
    main()
