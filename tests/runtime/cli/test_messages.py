"""What the CLI says (issue 40): bad flag values are one line on stderr, exit 2; bounded latencies; ``--samples
0`` means no ranges everywhere; ``gpus local`` reads any NVML binding."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

import kdvfs.runtime.device.nvml_device as device_nvml
from kdvfs.runtime.cli import main
from kdvfs.runtime.testing.fake_nvml import EnergyFakeNvml
from tests.schema_check import strict_loads, validate

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


def test_samples_0_means_ranges_from_the_validated_error_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", *PROBLEM, "--pair", "1410:3201", "--samples", "0", "--json"]) == 0
    predicted = strict_loads(capsys.readouterr().out)
    validate(predicted, "predict")
    assert all(row["range"]["parameter_samples"] == 0 for row in predicted["predictions"])
    assert main(["compare", *PROBLEM, "--budget", "0.01", "--samples", "0", "--json"]) == 0
    rows = strict_loads(capsys.readouterr().out)
    validate(rows, "compare")
    assert all(row["range"]["parameter_samples"] == 0 for row in rows)


def test_gpus_local_takes_an_nvml_module(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "local", "--nvml-module", "kdvfs.runtime.testing.nvml", "--json"]) == 0
    gpus = strict_loads(capsys.readouterr().out)
    validate(gpus, "gpus-local")
    assert "H200" in gpus[0]["name"]


def test_reset_says_what_to_do_when_it_fails_itself(shared_nvml: EnergyFakeNvml, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(device_nvml, "has_clock_permission", lambda *args: True)
    nvml = ["--nvml-module", "kdvfs.runtime.testing.nvml"]
    assert main(["reset", "--gpu-index", "3", *nvml]) == 2
    err = capsys.readouterr().err
    assert "there is no GPU 3" in err and "0-0" in err and "locked clocks" not in err, err
    shared_nvml.state.failures["nvmlDeviceResetGpuLockedClocks"] = pynvml.NVML_ERROR_UNKNOWN
    assert main(["reset", "--gpu-index", "0", *nvml]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "may still be at locked clocks" in err, err
    assert "kdvfs reset" not in err and "nvidia-smi -i 0 -rgc -rmc" in err, err


def test_report_of_a_short_run_says_why_it_measured_nothing(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    window = {"event": "window", "first_step": 0, "last_step": 9, "arm": "A", "pair": 0, "steps": 10,
              "step_time_s": 0.1, "start_s": 0.0, "end_s": 1.0, "controlled_steps": 0}
    empty = {"energy_saved_pct": None, "energy_saved_ci95_pct": None, "slowdown_pct": None,
             "slowdown_ci95_pct": None, "windows_auto": 1, "windows_controlled": 0}
    log = tmp_path / "run.jsonl"
    log.write_text("\n".join(json.dumps(record) for record in (window, {"event": "pair", "step": 9,
                                                                          "measured": empty})) + "\n")
    assert main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    assert "no A/B pair completed" in out and "run longer" in out, out


def test_demo_off_a_terminal_shows_progress_on_stderr_and_writes_its_results(capsys: pytest.CaptureFixture[str],
                                                                             tmp_path: Path) -> None:
    assert main(["demo", "--trace", "h200/gpt3xl-1layer-b4", "--samples", "0", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "kdvfs demo: planning" in captured.err, captured.err
    rows = strict_loads((tmp_path / "results.json").read_text())
    validate(rows, "compare")  # as `kdvfs compare --json`
    assert {row["method"] for row in rows} >= {"auto", "ilp"} and {row["budget_pct"] for row in rows} >= {0.0, 1.0}
    assert (tmp_path / "pareto.png").is_file() and "results.json" in captured.out
