"""A vision transformer under the Hugging Face ``Trainer``: ViT-B/16 (from its config, random weights) on random images.

    python examples/hf_vit.py [--size base|tiny] [--batch 64] [--steps 200] [--device cpu]
    kdvfs capture -o vit.trace.json -- python examples/hf_vit.py --steps 60

Nothing here knows kdvfs (``docs/guide/capture.md``). Needs ``transformers``. bf16 on a GPU, fp32 on a CPU.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification

SIZES = {"base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
                  "image_size": 224},
         "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
                  "image_size": 32}}
CLASSES = 1000
SAMPLES = 512
"""Random images held (the Trainer loops over them)."""


class RandomImages(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """``count`` random ``size`` x ``size`` RGB images with random labels (seeded)."""

    def __init__(self, count: int, size: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randn(count, 3, size, size, generator=generator)
        self.labels = torch.randint(CLASSES, (count,), generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.images[index], "labels": self.labels[index]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    on_gpu = args.device != "cpu"
    config = ViTConfig(num_labels=CLASSES, **SIZES[args.size])
    with tempfile.TemporaryDirectory() as output:
        training = TrainingArguments(output_dir=output, max_steps=args.steps, per_device_train_batch_size=args.batch,
                                     learning_rate=1e-4, bf16=on_gpu, use_cpu=not on_gpu, save_strategy="no",
                                     logging_steps=max(1, args.steps // 4), report_to=[], dataloader_num_workers=0)
        dataset = RandomImages(min(SAMPLES, args.steps * args.batch), config.image_size)
        Trainer(model=ViTForImageClassification(config), args=training, train_dataset=dataset).train()


if __name__ == "__main__":
    main()
