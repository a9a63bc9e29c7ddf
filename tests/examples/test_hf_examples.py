"""The Hugging Face examples run tiny on the CPU, and dynamic padding gives steps of varying shape."""

from __future__ import annotations

import re
import shlex
import sys

import pytest

from kdvfs.envs.common.paths import REPO_ROOT

pytest.importorskip("transformers")
sys.path.insert(0, str(REPO_ROOT / "examples"))
import hf_sft
import hf_vit


@pytest.mark.parametrize("model", ["llama", "mixtral", "bert"])
def test_sft_trains_tiny_on_the_cpu(model: str) -> None:
    hf_sft.main(["--model", model, "--size", "tiny", "--batch", "2", "--min-len", "8", "--max-len", "48",
                 "--steps", "2", "--device", "cpu"])


def test_vit_trains_tiny_on_the_cpu() -> None:
    hf_vit.main(["--size", "tiny", "--batch", "2", "--steps", "2", "--device", "cpu"])


def test_dynamic_padding_pads_each_batch_to_its_longest_sample() -> None:
    from transformers import DataCollatorForLanguageModeling

    samples = hf_sft.RandomSamples(64, 8, 200, seed=1)
    collator = DataCollatorForLanguageModeling(hf_sft.word_tokenizer(), mlm=False)
    widths = set()
    for start in range(0, 64, 8):
        batch = collator([samples[i] for i in range(start, start + 8)])
        assert batch["input_ids"].shape[1] == max(samples.lengths[start:start + 8])
        widths.add(batch["input_ids"].shape[1])
    assert len(widths) > 1
    collator = DataCollatorForLanguageModeling(hf_sft.word_tokenizer(), mlm=False, pad_to_multiple_of=64)
    assert collator([samples[i] for i in range(8)])["input_ids"].shape[1] % 64 == 0


def test_bad_lengths_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        hf_sft.parse_args(["--min-len", "100", "--max-len", "10"])
    assert "--min-len" in capsys.readouterr().err


def _cpu_sft_commands() -> list[list[str]]:
    """The arguments of every ``examples/hf_sft.py ... --device cpu`` command in the user guide (code and inline)."""
    commands = []
    for page in sorted((REPO_ROOT / "docs" / "guide").glob("*.md")):
        text = re.sub(r"\\\n\s*", "", page.read_text())
        for match in re.finditer(r"hf_sft\.py([^`\n]*)", text):
            argv = shlex.split(match.group(1))
            if "--device" in argv and argv[argv.index("--device") + 1] == "cpu":
                commands.append(argv)
    return commands


def test_the_cpu_guides_sft_takes_a_small_step() -> None:
    # A step's work, not its time: the logits (tokens x vocabulary) and the weights, which a CPU step is
    # spent on. At the former default (Llama tiny, 8 x 1024 tokens, 32000 words) a step took ~5-11 s on a
    # 2-core machine; at these bounds it takes ~0.1 s.
    commands = _cpu_sft_commands()
    assert len(commands) >= 2, commands
    for argv in commands:
        args = hf_sft.parse_args(argv)
        model = hf_sft.build_model(args.model, args.size, args.max_len)
        logits = args.batch * args.max_len * model.config.vocab_size
        assert logits <= 2**21 and sum(p.numel() for p in model.parameters()) <= 500_000, (argv, logits)
