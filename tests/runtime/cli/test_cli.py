"""The kdvfs command line: trace, gpus and demo, including exit codes and one-line errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kdvfs.common.paths import RAW_DATA_DIR
from kdvfs.envs.trace.format import load_trace
from kdvfs.runtime.cli import main
from tests.schema_check import strict_loads, validate

RAW = RAW_DATA_DIR / "h200"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_trace_show_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "trace", "show", "h200/gpt3xl-24layer-b4", "--json")
    summary = strict_loads(out)
    validate(summary, "trace-show")
    assert code == 0
    assert summary["kernels_per_step"] == 1438 and summary["memsets_per_step"] == 421
    assert set(summary["by_phase"]) == {"forward", "backward", "optimizer"}
    assert sum(row["share"] for row in summary["by_category"].values()) == pytest.approx(1.0)


def test_trace_import_with_ncu(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_path = tmp_path / "r.trace.json.gz"
    code, out, _ = run(capsys, "trace", "import", str(RAW / "trace_resnet50_b128.json.gz"), "-o", str(out_path),
                       "--ncu", str(RAW / "ncu_resnet50_first400.csv.gz"), "--energy-j-per-step", "17.2")
    assert code == 0 and "400 with ncu counters" in out
    trace = load_trace(out_path)
    assert trace.meta.measurements["energy_j_per_step"] == 17.2
    assert int(trace.has_features.sum()) == 400


def test_import_of_a_corrupt_file_fails_cleanly(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes((RAW / "trace_gpt2s_b16.json.gz").read_bytes()[:2000])
    out_path = tmp_path / "out.json"
    code, _, err = run(capsys, "trace", "import", str(bad), "-o", str(out_path))
    assert code == 2
    assert err.count("\n") == 1 and str(bad) in err
    assert not out_path.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad.json.gz"]


def test_trace_import_format_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = str(RAW / "trace_gpt2s_b16.json.gz")
    code, out, _ = run(capsys, "trace", "import", source, "--format", "kineto", "-o", str(tmp_path / "k.json"))
    assert code == 0 and "step 1" in out
    assert load_trace(tmp_path / "k.json").meta.source == "kineto:trace_gpt2s_b16.json.gz"
    code, _, err = run(capsys, "trace", "import", source, "--format", "nope", "-o", str(tmp_path / "n.json"))
    assert code == 2 and err.count("\n") == 1
    assert "unknown trace format 'nope'; known formats: kineto" in err and not (tmp_path / "n.json").exists()


def test_trace_show_of_unknown_trace(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "trace", "show", "h200/nothing")
    assert code == 2 and "bundled:" in err


def test_gpus_list_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "gpus")
    assert code == 0 and "rtx3080ti" in out and "b200" in out
    code, out, _ = run(capsys, "gpus", "show", "h200", "--json")
    profile = strict_loads(out)
    validate(profile, "gpus-show")
    assert code == 0 and profile["clocks"]["memory_mhz"] == [3201, 2201]
    assert len(profile["clocks"]["core_mhz"]["3201"]) == 110


def test_unknown_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "gpus", "show", "h300")
    assert code == 2 and "unknown GPU 'h300'" in err


def test_demo_on_a_small_trace_writes_the_plot_and_run_record(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    # Two sampled profiles: the ranges' path at a quarter of the default's cost.
    code, out, _ = run(capsys, "demo", "--trace", "h200/gpt3xl-1layer-b4", "--samples", "2", "--out", str(tmp_path))
    assert code == 0
    assert "GPU profile h200" in out and "latency-optimal" in out and "measured" in out
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["config"]["trace"] == "gpt3xl-1layer-b4" and record["git_revision"]


@pytest.mark.slow
def test_demo_on_the_default_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "demo", "--out", str(tmp_path))
    assert code == 0
    assert "1438" in out and "GPU profile h200" in out and "220" in out


def test_console_script_is_installed() -> None:
    script = shutil.which("kdvfs", path=str(Path(sys.executable).parent))
    assert script is not None
    result = subprocess.run([script, "trace", "list"], capture_output=True, text=True, check=True)
    assert "h200/gpt3xl-24layer-b4" in result.stdout.split()


def test_trace_generate(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_path = tmp_path / "g.trace.json"
    code, out, _ = run(capsys, "trace", "generate", "--workload", "gpt2s", "--gpu", "h200", "-o", str(out_path))
    assert code == 0 and "wrote" in out
    assert load_trace(out_path).meta.workload == "gpt2s"
    code, _, err = run(capsys, "trace", "generate", "--workload", "nope", "--gpu", "h200", "-o", str(out_path))
    assert code == 2 and "nope" in err


def test_predict_says_when_the_measurements_come_from_another_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "predict", "--trace", "h200/gpt3xl-1layer-b4", "--gpu", "rtx3080ti", "--json")
    validate(strict_loads(out), "predict")
    assert code == 0 and "recorded on NVIDIA H200, not on NVIDIA GeForce RTX 3080 Ti" in err
    code, _, err = run(capsys, "predict", "--trace", "h200/gpt3xl-1layer-b4", "--gpu", "h200")
    assert code == 0 and err == ""
