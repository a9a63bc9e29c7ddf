"""Every command checks its output paths before any work: a folder where a file goes, a path under a file or an
output that is one of the inputs is a one-line error, exit 2, and the inputs stay as they were."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from kdvfs.common.paths import GPU_PROFILE_DIR, RAW_DATA_DIR
from kdvfs.runtime.cli import main
from kdvfs.runtime.cli.offline import plan as plan_cmd

SMALL = "h200/gpt3xl-1layer-b4"


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.fixture
def blocked(tmp_path: Path) -> Path:
    """A path whose parent is a file: nothing can be written there."""
    (tmp_path / "file.txt").write_text("x")
    return tmp_path / "file.txt" / "out"


def test_capture_never_runs_the_script_when_its_output_cannot_be_written(capsys: pytest.CaptureFixture[str],
                                                                         tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    command = ["--cpu-test-mode", "--no-energy", "--", sys.executable, str(script)]
    _refused(capsys, ["capture", "-o", str(tmp_path), *command], "is a folder")
    _refused(capsys, ["capture", "-o", str(script), *command], "is also an input")
    _refused(capsys, ["capture", "-o", str(tmp_path / "t.json"), "--keep-profile", str(tmp_path), *command],
             "is a folder")
    assert not (tmp_path / "ran").exists() and script.read_text().startswith("open(")


def test_plan_and_compare_check_before_planning(capsys: pytest.CaptureFixture[str], blocked: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def no_work(*args: object) -> None:
        raise AssertionError("planned before checking the output")

    monkeypatch.setattr(plan_cmd, "problem_from_args", no_work)
    problem = ["--trace", SMALL, "--gpu", "h200", "--budget", "0.01"]
    _refused(capsys, ["plan", *problem, "--method", "ilp", "-o", str(blocked)], "file.txt is not a folder")
    _refused(capsys, ["compare", *problem, "--plot", str(blocked.parent.parent)], "is a folder")


def test_train_checks_its_run_folder_first(capsys: pytest.CaptureFixture[str], blocked: Path) -> None:
    _refused(capsys, ["train", "--gpu", "h200", "--out", str(blocked.parent)], "is a file; give a folder")
    _refused(capsys, ["demo", "--out", str(blocked)], "file.txt is not a folder")


def test_trace_outputs(capsys: pytest.CaptureFixture[str], tmp_path: Path, blocked: Path) -> None:
    source = tmp_path / "a.json.gz"
    shutil.copy(RAW_DATA_DIR / "h200" / "trace_gpt3xl_1layer_b4.json.gz", source)
    original = source.read_bytes()
    _refused(capsys, ["trace", "import", str(source), "-o", str(source)], "is also an input")
    _refused(capsys, ["trace", "import", str(source), "-o", str(tmp_path)], "is a folder")
    _refused(capsys, ["trace", "generate", "--workload", "gpt2s", "--gpu", "h200", "-o", str(blocked)], "not a folder")
    assert source.read_bytes() == original


def test_model_outputs_never_overwrite_their_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "gtx980.csv"
    shutil.copy(RAW_DATA_DIR / "public" / "gtx980-dvfs-sweep.csv", source)
    original = source.read_bytes()
    _refused(capsys, ["model", "convert", "wang-chu", str(source), "--gpu", "gtx980", "-o", str(source)],
             "is also an input")
    profile = tmp_path / "h200.yaml"
    shutil.copy(GPU_PROFILE_DIR / "h200.yaml", profile)
    _refused(capsys, ["model", "fit", "--sweep", str(source), "--gpu", str(profile), "-o", str(profile)],
             "is also an input")
    assert source.read_bytes() == original


def test_device_commands_check_before_touching_nvml(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                    blocked: Path) -> None:
    nvml = ["--nvml-module", "no_such_nvml_binding"]
    _refused(capsys, ["calibrate", "-o", str(tmp_path), *nvml], "is a folder")
    _refused(capsys, ["calibrate", "-o", str(tmp_path / "p.yaml"), "--save-sweep", str(blocked), *nvml],
             "not a folder")
    _refused(capsys, ["gpus", "local", "--write", str(tmp_path)], "is a folder")
    run = ["run", "--policy", "plan.json", "--trace", SMALL, "--dry-run", *nvml]
    _refused(capsys, [*run, "--log", str(tmp_path), "--", sys.executable, "x.py"], "is a folder")
    _refused(capsys, [*run, "--tensorboard", str(blocked), "--", sys.executable, "x.py"], "not a folder")


def test_no_output_overwrites_a_trace_profile_script_or_log(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "in.trace.json"
    assert main(["trace", "generate", "--workload", "gpt2s", "--gpu", "h200", "-o", str(trace)]) == 0
    capsys.readouterr()
    profile = tmp_path / "h200.yaml"
    shutil.copy(GPU_PROFILE_DIR / "h200.yaml", profile)
    script = tmp_path / "train.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    data = tmp_path / "data.bin"
    data.write_bytes(b"data")
    log = tmp_path / "run.jsonl"
    log.write_text('{"event": "window"}\n')
    originals = {path: path.read_bytes() for path in (trace, profile, script, data, log)}
    problem = ["--trace", str(trace), "--gpu", str(profile), "--budget", "0.01"]
    _refused(capsys, ["plan", *problem, "--method", "ilp", "-o", str(trace)], "is also an input")
    _refused(capsys, ["plan", *problem, "--method", "ilp", "-o", str(profile)], "is also an input")
    _refused(capsys, ["compare", *problem, "--plot", str(trace)], "is also an input")
    _refused(capsys, ["trace", "generate", "--workload", "gpt2s", "--gpu", str(profile), "-o", str(profile)],
             "is also an input")
    command = ["--", sys.executable, str(script), f"--data={data}"]
    run = ["run", "--policy", str(trace), "--trace", str(trace), "--cpu-test-mode", "--dry-run"]
    _refused(capsys, [*run, "--log", str(script), *command], "is also an input")
    _refused(capsys, [*run, "--log", str(data), *command], "is also an input")
    capture = ["capture", "--cpu-test-mode", "--no-energy"]
    _refused(capsys, [*capture, "-o", str(data), *command], "is also an input")
    _refused(capsys, ["report", str(log), "--plot", str(log)], "is also an input")
    assert not (tmp_path / "ran").exists()
    assert all(path.read_bytes() == content for path, content in originals.items())


def test_bundled_names_count_as_their_files() -> None:
    from argparse import Namespace

    from kdvfs.envs.trace.bundled import trace_path

    inputs = plan_cmd.problem_inputs(Namespace(trace="h200/gpt3xl-1layer-b4", gpu="H200"))
    assert inputs == [trace_path("h200/gpt3xl-1layer-b4"), GPU_PROFILE_DIR / "h200.yaml"]
    assert plan_cmd.problem_inputs(Namespace(trace="nope/none", gpu=None)) == ["nope/none", None]
