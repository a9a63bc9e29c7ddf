"""``kdvfs capture`` end to end on the CPU example with a fake NVML, and its error paths: exit codes passed
through, one-line errors, nothing written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pynvml
import pytest

from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.trace import Phase
from kdvfs.runtime.capture.capture_launch import split_command
from kdvfs.runtime.child import CommandError, UserCommand
from kdvfs.runtime.cli import main
from tests.schema_check import strict_loads, validate

FAKE = ["--nvml-module", "kdvfs.runtime.testing.nvml"]
FAST = ["--steps", "1", "--warmup", "1", "--energy-window-s", "0.05"]
TRAIN = """
import sys
import torch
model = torch.nn.Linear(8, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range({steps}):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).square().sum().backward()
    optimizer.step()
{ending}
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def script(folder: Path, steps: int, ending: str = "") -> str:
    path = folder / "train.py"
    path.write_text(TRAIN.format(steps=steps, ending=ending))
    return str(path)


def test_captures_the_cpu_example(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KDVFS_FAKE_NVML", json.dumps({"power_w": 350.0}))
    output = tmp_path / "gpt.trace.json"
    code, out, err = run(capsys, "capture", "--cpu-test-mode", *FAKE, "--steps", "2", "--warmup", "2",
                         "--energy-window-s", "0.3", "-o", str(output), "--json", "--", sys.executable,
                         str(REPO_ROOT / "examples" / "gpt.py"), "--device", "cpu", "--steps", "300")
    assert code == 0, err
    report = strict_loads(out)
    validate(report, "capture")
    trace = load_trace(output)
    assert report["output"] == str(output) and report["workload"] == "gpt" == trace.meta.workload
    assert report["avg_power_w"] == pytest.approx(350.0, rel=0.02)
    assert trace.meta.measurements["energy_j_per_step"] == pytest.approx(350.0 * report["step_time_s"], rel=0.02)
    assert {k.phase for k in trace.kernels} == {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt.trace.json"]


@pytest.mark.parametrize(("ending", "exit_code"), [("raise RuntimeError('boom')", 1), ("sys.exit(7)", 7)])
def test_failing_script_passes_its_exit_code(capsys: pytest.CaptureFixture[str], tmp_path: Path, ending: str,
                                             exit_code: int) -> None:
    output = tmp_path / "t.json"
    code, _, err = run(capsys, "capture", "--cpu-test-mode", "--no-energy", "--warmup", "50", "-o", str(output),
                       "--", sys.executable, script(tmp_path, 3, ending))
    assert code == exit_code
    assert err.count("kdvfs: error:") == 1 and f"exited with code {exit_code}" in err and "nothing was written" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_script_without_a_step_boundary(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "capture", "--cpu-test-mode", "--no-energy", "-o", str(tmp_path / "t.json"), "--",
                       sys.executable, script(tmp_path, 0))
    assert code == 2 and "without reaching a step boundary (no torch.optim optimizer step)" in err
    assert err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_cpu_only_script_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "capture", "--no-energy", *FAST, "-o", str(tmp_path / "t.json"), "--",
                       sys.executable, script(tmp_path, 20))
    assert code == 2 and "no CUDA kernels recorded: the script ran on the CPU" in err and "--cpu-test-mode" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_machine_without_nvml_is_a_one_line_error(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KDVFS_FAKE_NVML", json.dumps({"failures": {"nvmlInit": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND}}))
    code, _, err = run(capsys, "capture", "--cpu-test-mode", *FAKE, *FAST, "-o", str(tmp_path / "t.json"), "--",
                       sys.executable, script(tmp_path, 20))
    assert code == 2 and err.startswith("kdvfs: error: cannot initialise NVML") and err.count("\n") == 1
    assert "install the NVIDIA driver" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


@pytest.mark.parametrize(("options", "hint"), [
    (FAKE, "off a GPU, try the CPU test mode: --cpu-test-mode --nvml-module kdvfs.runtime.testing.nvml"),
    (["--cpu-test-mode", *FAKE], "in CPU test mode off a GPU, use the fake NVML (--nvml-module "
                                 "kdvfs.runtime.testing.nvml) or --no-energy"),
])
def test_capture_off_a_gpu_points_at_the_cpu_test_mode(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, options: list[str],
                                                       hint: str) -> None:
    monkeypatch.setenv("KDVFS_FAKE_NVML", json.dumps({"failures": {"nvmlInit": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND}}))
    code, _, err = run(capsys, "capture", *options, *FAST, "-o", str(tmp_path / "t.json"), "--",
                       sys.executable, script(tmp_path, 20))
    assert code == 2 and err.count("\n") == 1 and hint in err, err


@pytest.mark.parametrize(("command", "message"), [
    ([], "no command to run"),
    (["bash", "train.sh"], "'bash' is not a Python interpreter"),
    (["python", "-c", "print(1)"], "no script or module to run"),
    (["python", "missing.py"], "missing.py: no such script"),
])
def test_bad_commands(command: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        split_command(["--", *command])


def test_commands_the_child_understands(tmp_path: Path) -> None:
    path = script(tmp_path, 1)
    assert split_command(["python3.12", path, "--x"]) == UserCommand(("python3.12",), (path, "--x"))
    assert split_command(["/usr/bin/python", "-m", "pkg.train", "-v"]) == UserCommand(("/usr/bin/python",),
                                                                                      ("-m", "pkg.train", "-v"))


def test_torchrun_commands_put_the_bootstrap_in_every_worker(tmp_path: Path) -> None:
    path = script(tmp_path, 1)
    user = split_command(["torchrun", "--nproc-per-node", "2", "--standalone", path, "--steps", "3"])
    assert user == UserCommand(("torchrun", "--nproc-per-node", "2", "--standalone"), (path, "--steps", "3"), True)
    assert user.boot_argv("kdvfs.runtime.capture.capture_boot", Path("c.json")) == [
        "torchrun", "--nproc-per-node", "2", "--standalone", "-m", "kdvfs.runtime.capture.capture_boot", "c.json", path,
        "--steps", "3"]
    module = split_command(["python", "-m", "torch.distributed.run", "--nproc_per_node=4", "-m", "pkg.train", "-v"])
    assert module == UserCommand(("python", "-m", "torch.distributed.run", "--nproc_per_node=4"),
                                 ("-m", "pkg.train", "-v"), True)
    with pytest.raises(CommandError, match="--no-python"):
        split_command(["torchrun", "--no-python", "bash", "x.sh"])
    with pytest.raises(CommandError, match=r"missing\.py: no such script"):
        split_command(["torchrun", "--nproc-per-node", "2", "missing.py"])


def test_ncu_must_be_installed(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    code, _, err = run(capsys, "capture", "--ncu", "-o", str(tmp_path / "t.json"), "--", sys.executable,
                       script(tmp_path, 1))
    assert code == 2 and "`ncu` is not on the PATH" in err
