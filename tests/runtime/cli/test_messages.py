"""What the CLI says (issue 40): bad flag values are one line on stderr, exit 2; bounded latencies; ``--samples
0`` means no ranges everywhere; ``gpus local`` reads any NVML binding."""

from __future__ import annotations

import json

import pytest

from kdvfs.runtime.cli import main

PROBLEM = ["--trace", "h200/gpt3xl-1layer-b4", "--gpu", "h200"]


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.out == "", captured.err
    return captured.err


@pytest.mark.parametrize("argv", [
    ["plan", *PROBLEM, "--budget", "0.01", "--method", "ilp", "--latency-ms", "1e9"],
    ["compare", *PROBLEM, "--budget", "0.01", "--latency-ms", "-1"],
    ["run", "--policy", "h200", "--trace", "h200/gpt2s-b16", "--latency-ms", "20000", "--", "python", "x.py"],
    ["plan", *PROBLEM, "--budget", "abc", "--method", "ilp"],
    ["plan", *PROBLEM, "--budget", "0.01", "--method", "nope"],
    ["predict", *PROBLEM, "--samples", "-1"],
    ["trace", "show"],
])
def test_bad_values_are_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    err = _one_line_error(capsys, argv)
    assert err.startswith(f"kdvfs {argv[0]}") and ": error: " in err


def test_samples_0_means_no_ranges(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", *PROBLEM, "--uncertainty", "--samples", "0", "--json"]) == 0
    assert "uncertainty" not in json.loads(capsys.readouterr().out)
    assert main(["compare", *PROBLEM, "--budget", "0.01", "--uncertainty", "--samples", "0", "--json"]) == 0
    assert all("uncertainty" not in row for row in json.loads(capsys.readouterr().out))


def test_gpus_local_takes_an_nvml_module(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "local", "--nvml-module", "kdvfs.runtime.testing.nvml", "--json"]) == 0
    assert "H200" in json.loads(capsys.readouterr().out)[0]["name"]
