"""Supervised fine-tuning under the Hugging Face ``Trainer`` with dynamic padding: every step has its own shape.

    python examples/hf_sft.py [--model llama|mixtral|bert|t5] [--size small|tiny] [--steps 300] ...  # --help
    kdvfs capture -o sft.trace.json -- python examples/hf_sft.py --steps 120
    kdvfs run --dry-run --policy policies/h200.kdvfs-policy.npz --trace sft.trace.json -- python examples/hf_sft.py

Samples of random token ids (seeded) with lengths uniform in ``[--min-len, --max-len]`` or log-normal around
``--median-len``, batched by the library's collator, which pads each batch to its longest sample (optionally
to a multiple of ``--pad-to-multiple-of``): the step's lengths, kernels and time change from step to step.
``--grad-accum N`` accumulates N micro-batches per step; ``--packing`` (decoders) concatenates a batch's
samples into one row. Models are built from their configs with random weights (no download): ``llama`` (a
decoder), ``mixtral`` (8 experts, top-2), ``bert`` (an encoder classifier), ``t5`` (an encoder-decoder whose
targets have their own lengths); ``tiny`` is for the CPU. Nothing here knows kdvfs: capture and control attach
from outside (``docs/guide/capture.md``). Needs ``transformers`` and ``tokenizers``. bf16 on a GPU, fp32 on a CPU.
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
    DataCollatorForSeq2Seq,
    DataCollatorWithFlattening,
    DataCollatorWithPadding,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
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
LOGNORMAL_SIGMA = 0.7
"""Spread of ``--lengths lognormal`` (of the log of a sample's length)."""
TARGET_SHARE = 0.5
"""An encoder-decoder sample's target length: its own draw from the input lengths' distribution, scaled by this."""


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
    if model == "t5":
        hidden, heads = sizes["hidden_size"], sizes["num_attention_heads"]
        return T5ForConditionalGeneration(T5Config(
            vocab_size=sizes["vocab_size"], d_model=hidden, d_ff=sizes["intermediate_size"], d_kv=hidden // heads,
            num_heads=heads, num_layers=max(1, sizes["num_hidden_layers"] // 2), decoder_start_token_id=0,
            pad_token_id=0))
    return BertForSequenceClassification(BertConfig(max_position_embeddings=max(512, max_len),
                                                    num_labels=2, **sizes))


def word_tokenizer(vocab_size: int = VOCAB) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``vocab_size`` ids (built in memory: the collators need one for its padding
    id)."""
    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="[UNK]")),
                                   pad_token="[PAD]", unk_token="[UNK]")


def sample_lengths(count: int, min_len: int, max_len: int, generator: torch.Generator,
                   median_len: int | None = None) -> list[int]:
    """``count`` lengths: uniform in ``[min_len, max_len]``, or with ``median_len`` log-normal (median
    ``median_len``, ``LOGNORMAL_SIGMA``) clipped to that range."""
    if median_len is None:
        return torch.randint(min_len, max_len + 1, (count,), generator=generator).tolist()
    normal = torch.randn(count, generator=generator, dtype=torch.float64)
    return (median_len * torch.exp(LOGNORMAL_SIGMA * normal)).round().clamp(min_len, max_len).long().tolist()


class RandomSamples(torch.utils.data.Dataset[dict[str, Any]]):
    """``count`` samples of random token ids (ids 2 to ``vocab_size - 1``, seeded), lengths from
    :func:`sample_lengths`; with ``classes`` each has a random class label, with ``targets`` a random target
    sequence of its own length (``TARGET_SHARE`` of an independent draw), else none (the causal LM collator makes
    the labels)."""

    def __init__(self, count: int, min_len: int, max_len: int, classes: int = 0, seed: int = 0,
                 median_len: int | None = None, targets: bool = False, vocab_size: int = VOCAB) -> None:
        self.vocab_size = vocab_size
        generator = torch.Generator().manual_seed(seed)
        self.lengths = sample_lengths(count, min_len, max_len, generator, median_len)
        self.seeds = torch.randint(2**31 - 1, (count,), generator=generator).tolist()
        self.labels = torch.randint(max(classes, 1), (count,), generator=generator).tolist() if classes else None
        self.target_lengths = [max(1, round(TARGET_SHARE * n)) for n in sample_lengths(
            count, min_len, max_len, generator, median_len)] if targets else None

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(self.seeds[index])
        sample: dict[str, Any] = {"input_ids": torch.randint(2, self.vocab_size, (self.lengths[index],),
                                                             generator=generator).tolist()}
        if self.labels is not None:
            sample["labels"] = self.labels[index]
        if self.target_lengths is not None:
            sample["labels"] = torch.randint(2, self.vocab_size, (self.target_lengths[index],),
                                             generator=generator).tolist()
        return sample


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("llama", "mixtral", "bert", "t5"), default="llama")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--batch", type=int, default=8, help="samples per step (default 8)")
    parser.add_argument("--min-len", type=int, default=64, help="shortest sample, tokens (default 64)")
    parser.add_argument("--max-len", type=int, help="longest sample, tokens (default 1024; tiny: 128)")
    parser.add_argument("--lengths", choices=("uniform", "lognormal"), default="uniform",
                        help="sample length distribution (default uniform in [--min-len, --max-len])")
    parser.add_argument("--median-len", type=int, default=256, help="median of --lengths lognormal (default 256)")
    parser.add_argument("--pad-to-multiple-of", type=int, default=None, help="pad each batch to a multiple of N")
    parser.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step (default 1)")
    parser.add_argument("--packing", action="store_true",
                        help="concatenate each batch's samples into one row, no padding (decoders)")
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="data seed (default 0)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    args.max_len = MAX_LEN[args.size] if args.max_len is None else args.max_len
    if not 1 <= args.min_len <= args.max_len:
        parser.error(f"need 1 <= --min-len <= --max-len, got {args.min_len} and {args.max_len}")
    if args.grad_accum < 1:
        parser.error(f"--grad-accum must be at least 1, got {args.grad_accum}")
    if args.packing and args.model not in ("llama", "mixtral"):
        parser.error(f"--packing is for the decoders (llama, mixtral), not {args.model}")
    return args


def collator_for(args: argparse.Namespace, tokenizer: PreTrainedTokenizerFast, model: PreTrainedModel) -> Any:
    """The library collator of the recipe (see the module docstring)."""
    if args.packing:
        return DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    if args.model == "bert":
        return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=args.pad_to_multiple_of)
    if args.model == "t5":
        return DataCollatorForSeq2Seq(tokenizer, model=model, pad_to_multiple_of=args.pad_to_multiple_of)
    return DataCollatorForLanguageModeling(tokenizer, mlm=False, pad_to_multiple_of=args.pad_to_multiple_of)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    on_gpu = args.device != "cpu"
    vocab_size = SIZES[args.size]["vocab_size"]
    tokenizer = word_tokenizer(vocab_size)
    classes = 2 if args.model == "bert" else 0
    dataset = RandomSamples(args.steps * args.batch * args.grad_accum, args.min_len, args.max_len, classes, args.seed,
                            args.median_len if args.lengths == "lognormal" else None, targets=args.model == "t5",
                            vocab_size=vocab_size)
    with tempfile.TemporaryDirectory() as output:
        training = TrainingArguments(output_dir=output, max_steps=args.steps, per_device_train_batch_size=args.batch,
                                     gradient_accumulation_steps=args.grad_accum,
                                     learning_rate=1e-4, bf16=on_gpu, use_cpu=not on_gpu, save_strategy="no",
                                     logging_steps=max(1, args.steps // 4), report_to=[], dataloader_num_workers=0,
                                     remove_unused_columns=False, seed=args.seed)
        model = build_model(args.model, args.size, max(args.max_len, 64) * (args.batch if args.packing else 1))
        collator = collator_for(args, tokenizer, model)
        Trainer(model=model, args=training, train_dataset=dataset, data_collator=collator).train()


if __name__ == "__main__":
    main()
