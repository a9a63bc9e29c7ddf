"""The Hugging Face examples run tiny on the CPU, and dynamic padding gives steps of varying shape."""

from __future__ import annotations

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
