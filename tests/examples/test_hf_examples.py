"""The Hugging Face examples run tiny on the CPU, and dynamic padding gives steps of varying shape; the
encoder-decoder, gradient accumulation and packing recipes go through ``kdvfs capture`` and ``kdvfs run
--dry-run`` (CPU test mode, fake NVML) with every step keyed by all its lengths."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.trace.shape import ShapeAxes
from kdvfs.envs.trace.trace_set import load_trace_set
from kdvfs.runtime.cli import main
from tests.schema_check import strict_loads, validate

pytest.importorskip("transformers")
sys.path.insert(0, str(REPO_ROOT / "examples"))
import hf_sft
import hf_vit

RECIPES = {"encoder-decoder": ["--model", "t5"], "grad-accum": ["--grad-accum", "2"], "packing": ["--packing"]}
"""The recipes whose steps vary in more than one length or in a packed length."""
VARIABLES = {"encoder-decoder": 2, "grad-accum": 2, "packing": 2}
"""The variables each recipe's step shapes hold: input and label tokens; each micro-batch's tokens; a packed
batch's total tokens and its longest sequence (``max_length_q``; its sequence count, ``cu_seq_lens``, is in the
shape too, constant at a fixed batch)."""
RECIPE_CALLS = {"grad-accum": 2}
"""Forward calls a step of each recipe makes (its step shape holds each call's inputs in turn); 1 where not named."""
TINY = ["--size", "tiny", "--device", "cpu", "--batch", "4", "--min-len", "8", "--max-len", "96", "--lengths",
        "lognormal", "--median-len", "32"]
CPU = ["--cpu-test-mode", "--nvml-module", "kdvfs.runtime.testing.nvml"]


@pytest.mark.parametrize("options", [["--model", "llama"], ["--model", "mixtral"], ["--model", "bert"],
                                     *RECIPES.values(), ["--lengths", "lognormal", "--median-len", "16"]])
def test_sft_trains_tiny_on_the_cpu(options: list[str]) -> None:
    hf_sft.main([*options, "--size", "tiny", "--batch", "2", "--min-len", "8", "--max-len", "48",
                 "--steps", "2", "--device", "cpu"])


def test_lognormal_lengths_have_their_median_and_stay_in_range() -> None:
    samples = hf_sft.RandomSamples(2000, 64, 1024, median_len=256, targets=True)
    lengths = sorted(samples.lengths)
    assert lengths[0] >= 64 and lengths[-1] <= 1024 and 230 <= lengths[len(lengths) // 2] <= 280
    assert samples.target_lengths is not None and samples.target_lengths != [round(n / 2) for n in lengths]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_is_captured_and_run_dry_on_the_cpu(recipe: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    script = [sys.executable, str(REPO_ROOT / "examples" / "hf_sft.py"), *RECIPES[recipe], *TINY]
    trace, plan = str(tmp_path / "sft.trace.json"), str(tmp_path / "plan.json")
    assert main(["capture", *CPU, "--warmup", "2", "--energy-window-s", "0.05", "--max-profiled-steps", "24",
                 "-o", trace, "--json", "--", *script, "--steps", "80"]) == 0
    capsys.readouterr()
    traces = load_trace_set(trace)
    shapes = [t.meta.step_shape for t in traces if t.meta.step_shape is not None]
    assert len(shapes) >= 3 and len(ShapeAxes.of(shapes).variables) == VARIABLES[recipe]
    assert main(["plan", "--trace", trace, "--gpu", "h200", "--method", "latency-optimal", "--budget", "0.01",
                 "-o", plan]) == 0
    capsys.readouterr()
    log = tmp_path / "run.jsonl"
    assert main(["run", "--dry-run", *CPU, "--policy", plan, "--trace", trace, "--log", str(log), "--json", "--",
                 *script, "--steps", "40"]) == 0
    summary = strict_loads(capsys.readouterr().out)
    windows = [r for r in map(json.loads, log.read_text().splitlines()) if r["event"] == "window"]
    assert all(len(w["new_inputs"]) == len(shapes[0].inputs) // RECIPE_CALLS.get(recipe, 1)
               for w in windows)  # the probe's counts by input position, from the training process
    assert windows or recipe == "packing"  # its tiny CPU steps mismatch too often to close a window in 40
    validate(summary, "run-summary")  # a run whose steps vary: its shapes' figures
    assert summary["shapes"] is not None and summary["controlled_steps"] > 0 and summary["gpu_restored"]
    assert set(summary["auto_reasons"]) <= {"ab_window", "no_plan", "no_shape", "after_off_script", "mismatch",
                                            "guard"}
    decided = sum(summary["auto_reasons"].values()) + summary["controlled_steps"]  # the first step is not decided,
    assert summary["steps"] - 1 <= decided <= summary["steps"]  # the step after the last may be


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
