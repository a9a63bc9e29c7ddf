"""Supervised fine-tuning under the Hugging Face ``Trainer`` with dynamic padding: every step has its own shape.

    python examples/hf_sft.py [--model llama|mixtral|bert] [--size small|tiny] [--batch 8]
                              [--min-len 64] [--max-len 1024 (tiny: 128)] [--pad-to-multiple-of N] [--steps 300]
                              [--device cpu]
    kdvfs capture -o sft.trace.json -- python examples/hf_sft.py --steps 120
    kdvfs run --dry-run --policy policies/h200.kdvfs-policy.npz --trace sft.trace.json -- python examples/hf_sft.py

The usual recipe: samples of varying length (here random token ids, seeded, lengths uniform in
``[--min-len, --max-len]``), batched by the library's collator, which pads each batch to its longest sample
(``DataCollatorForLanguageModeling(mlm=False)`` for the causal LMs, ``DataCollatorWithPadding`` for the encoder's
sequence classification), optionally to a multiple of ``--pad-to-multiple-of``. So the step's sequence length,
its kernels and its time change from step to step. ``--min-len`` equal to ``--max-len`` gives fixed-shape steps.

Models, built from their configs with random weights (no download): ``llama`` (a decoder), ``mixtral`` (a
mixture of experts: 8 experts, top-2 routing), ``bert`` (an encoder with a classification head). ``small`` has
a 32,000-word vocabulary and samples up to 1024 tokens; ``tiny`` (for the CPU: a step of a fraction of a second)
1024 words and up to 128 tokens. Nothing here
knows kdvfs: capture and control attach from outside (``docs/guide/capture.md``). Needs ``transformers`` and
``tokenizers`` (not kdvfs dependencies). bf16 on a GPU, fp32 on a CPU.
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

VOCAB = 32000
SIZES = {
    "small": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 12, "num_attention_heads": 16,
              "vocab_size": VOCAB},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "vocab_size": 1024},
}
MAX_LEN = {"small": 1024, "tiny": 128}
"""The default longest sample of each size, tokens."""
MOE_LAYERS = {"small": 8, "tiny": 2}
"""The mixture of experts' layers (its experts make each layer heavier)."""


def build_model(model: str, size: str, max_len: int) -> PreTrainedModel:
    """The model ``model`` at ``size`` (``SIZES``), random weights, positions for ``max_len`` tokens."""
    sizes = dict(SIZES[size])
    if model == "llama":
        return LlamaForCausalLM(LlamaConfig(max_position_embeddings=max_len, **sizes))
    if model == "mixtral":
        sizes["num_hidden_layers"] = MOE_LAYERS[size]
        return MixtralForCausalLM(MixtralConfig(max_position_embeddings=max_len, num_local_experts=8,
                                                num_experts_per_tok=2, num_key_value_heads=sizes["num_attention_heads"],
                                                **sizes))
    return BertForSequenceClassification(BertConfig(max_position_embeddings=max(512, max_len),
                                                    num_labels=2, **sizes))


def word_tokenizer(vocab_size: int = VOCAB) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``vocab_size`` ids (built in memory: the collators need one for its padding
    id)."""
    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="[UNK]")),
                                   pad_token="[PAD]", unk_token="[UNK]")


class RandomSamples(torch.utils.data.Dataset[dict[str, Any]]):
    """``count`` samples of random token ids (ids 2 to ``vocab_size - 1``, seeded), lengths uniform in
    ``[min_len, max_len]``; with ``classes`` each has a random class label, else none (the causal LM collator
    makes the labels)."""

    def __init__(self, count: int, min_len: int, max_len: int, classes: int = 0, seed: int = 0,
                 vocab_size: int = VOCAB) -> None:
        self.vocab_size = vocab_size
        generator = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(min_len, max_len + 1, (count,), generator=generator).tolist()
        self.seeds = torch.randint(2**31 - 1, (count,), generator=generator).tolist()
        self.labels = torch.randint(max(classes, 1), (count,), generator=generator).tolist() if classes else None

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(self.seeds[index])
        sample: dict[str, Any] = {"input_ids": torch.randint(2, self.vocab_size, (self.lengths[index],),
                                                             generator=generator).tolist()}
        if self.labels is not None:
            sample["labels"] = self.labels[index]
        return sample


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("llama", "mixtral", "bert"), default="llama")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--batch", type=int, default=8, help="samples per step (default 8)")
    parser.add_argument("--min-len", type=int, default=64, help="shortest sample, tokens (default 64)")
    parser.add_argument("--max-len", type=int, help="longest sample, tokens (default 1024; tiny: 128)")
    parser.add_argument("--pad-to-multiple-of", type=int, default=None, help="pad each batch to a multiple of N")
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="data seed (default 0)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    args.max_len = MAX_LEN[args.size] if args.max_len is None else args.max_len
    if not 1 <= args.min_len <= args.max_len:
        parser.error(f"need 1 <= --min-len <= --max-len, got {args.min_len} and {args.max_len}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    on_gpu = args.device != "cpu"
    vocab_size = SIZES[args.size]["vocab_size"]
    tokenizer = word_tokenizer(vocab_size)
    classes = 2 if args.model == "bert" else 0
    collator = (DataCollatorWithPadding(tokenizer, pad_to_multiple_of=args.pad_to_multiple_of) if classes else
                DataCollatorForLanguageModeling(tokenizer, mlm=False, pad_to_multiple_of=args.pad_to_multiple_of))
    dataset = RandomSamples(args.steps * args.batch, args.min_len, args.max_len, classes, args.seed, vocab_size)
    with tempfile.TemporaryDirectory() as output:
        training = TrainingArguments(output_dir=output, max_steps=args.steps, per_device_train_batch_size=args.batch,
                                     learning_rate=1e-4, bf16=on_gpu, use_cpu=not on_gpu, save_strategy="no",
                                     logging_steps=max(1, args.steps // 4), report_to=[], dataloader_num_workers=0,
                                     remove_unused_columns=False, seed=args.seed)
        model = build_model(args.model, args.size, max(args.max_len, 64))
        Trainer(model=model, args=training, train_dataset=dataset, data_collator=collator).train()


if __name__ == "__main__":
    main()
