"""An unmodified Hugging Face ``Trainer`` script: GPT-2 (from its config, random weights) on random tokens.

    python examples/hf_trainer.py [--size gpt2s|tiny] [--batch 8] [--seq 1024] [--steps 200] [--device cpu]
    kdvfs capture -o hf.trace.json -- python examples/hf_trainer.py --steps 60
    kdvfs run --dry-run --policy policies/h200.kdvfs-policy.npz --trace hf.trace.json -- python examples/hf_trainer.py

Nothing here knows kdvfs: capture and control attach from outside, through the optimizer's step hook
(``docs/guide/capture.md``). Needs ``transformers`` (not a kdvfs dependency). bf16 on a GPU, fp32 on a CPU.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

MAX_SAMPLES = 4096
"""Random sequences held (the Trainer loops over them for more steps): 32 MB at 1024 tokens."""
SIZES = {"gpt2s": {"n_layer": 12, "n_head": 12, "n_embd": 768}, "tiny": {"n_layer": 2, "n_head": 2, "n_embd": 64}}


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """``samples`` sequences of ``seq`` random token ids (seeded); each is its own label (causal LM)."""

    def __init__(self, samples: int, seq: int, vocab: int, seed: int = 0) -> None:
        self.tokens = torch.randint(vocab, (samples, seq), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="gpt2s")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    on_gpu = args.device != "cpu"
    config = GPT2Config(n_positions=args.seq, **SIZES[args.size])
    with tempfile.TemporaryDirectory() as output:
        training = TrainingArguments(output_dir=output, max_steps=args.steps, per_device_train_batch_size=args.batch,
                                     learning_rate=3e-4, bf16=on_gpu, use_cpu=not on_gpu, save_strategy="no",
                                     logging_steps=max(1, args.steps // 4), report_to=[], dataloader_num_workers=0)
        dataset = RandomTokens(min(args.steps * args.batch, MAX_SAMPLES), args.seq, config.vocab_size)
        Trainer(model=GPT2LMHeadModel(config), args=training, train_dataset=dataset).train()


if __name__ == "__main__":
    main()
