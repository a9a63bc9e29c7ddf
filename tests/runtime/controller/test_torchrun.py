"""torchrun under ``kdvfs capture`` and ``kdvfs run`` off a GPU: two gloo ranks of ``examples/gpt.py --ddp`` in
CPU test mode, one fake GPU each (the fake NVML's lock state shared through files): per-rank traces with the
job's step time and communication, per-rank plans, a dry run and a non-dry run in lockstep with one job
summary and per-rank rows, and a SIGKILL of one rank that leaves no GPU of the job locked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kdvfs.envs.common.paths import REPO_ROOT
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.trace import Category
from tests.runtime.controller.test_run_end_to_end import KDVFS, NVML, PERMISSION_SHIM, _wait

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone"]
GPT_DDP = [str(REPO_ROOT / "examples" / "gpt.py"), "--size", "tiny", "--device", "cpu", "--ddp"]
RANKS = (0, 1)


def _environment(folder: Path) -> dict[str, str]:
    shim = folder / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(PERMISSION_SHIM)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
            "KDVFS_FAKE_NVML": json.dumps({"gpus": 2}), "KDVFS_FAKE_NVML_STATE": str(folder / "gpu.json")}


def _kdvfs(argv: list[str], environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KDVFS, *argv], capture_output=True, text=True, cwd=REPO_ROOT, env=environment, check=False)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-rank capture (``step.rankR.trace.json``) and each rank's static plan (``plan.rankR.json``)."""
    folder = tmp_path_factory.mktemp("torchrun")
    done = _kdvfs(["capture", "--cpu-test-mode", "--nvml-module", NVML, "--energy-window-s", "0.3", "--json", "-o",
                   str(folder / "step.trace.json"), "--", *TORCHRUN, *GPT_DDP, "--steps", "1000"],
                  _environment(folder))
    assert done.returncode == 0, done.stderr[-3000:]
    (folder / "capture.json").write_text(done.stdout)
    for rank in RANKS:
        planned = _kdvfs(["plan", "--trace", str(folder / f"step.rank{rank}.trace.json"), "--gpu", "h200",
                          "--method", "static", "--slowdown", "0.01", "-o", str(folder / f"plan.rank{rank}.json")],
                         dict(os.environ))
        assert planned.returncode == 0, planned.stderr[-2000:]
    return folder


def _locks(folder: Path, gpu: int) -> dict[str, int]:
    state = folder / ("gpu.json" if gpu == 0 else f"gpu.json.gpu{gpu}")
    return dict(json.loads(state.read_text())) if state.is_file() else {}


def _run_argv(folder: Path, steps: int, dry_run: bool) -> list[str]:
    return [*KDVFS, "run", "--policy", str(folder / "plan.json"), "--trace", str(folder / "step.trace.json"),
            "--cpu-test-mode", "--nvml-module", NVML, "--log", str(folder / "run.jsonl"), "--json",
            *(["--dry-run"] if dry_run else []), "--", *TORCHRUN, *GPT_DDP, "--steps", str(steps)]


def _records(folder: Path, rank: int, event: str) -> list[dict[str, Any]]:
    lines = (folder / f"run.rank{rank}.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["event"] == event]


def test_each_rank_captures_its_own_trace_with_the_jobs_step_time(job: Path) -> None:
    report = json.loads((job / "capture.json").read_text())
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    slowest = max(r["step_time_s"] for r in ranks)
    assert report["job_step_time_s"] == pytest.approx(slowest) and ranks[1]["job_step_time_s"] == pytest.approx(slowest)
    for rank in RANKS:
        trace = load_trace(job / f"step.rank{rank}.trace.json")
        assert trace.meta.measurements["rank"] == rank and trace.meta.measurements["job_step_time_s"] == slowest
        communication = [k for k in trace.kernels if k.category is Category.COMMUNICATION]
        assert communication and trace.meta.measurements["communication_s"] > 0
    assert not (job / "step.trace.json").exists()


def test_a_one_rank_torchrun_job_names_its_trace_as_without_torchrun(tmp_path: Path) -> None:
    one_rank = [*TORCHRUN[:-2], "1", "--standalone"]
    done = _kdvfs(["capture", "--cpu-test-mode", "--nvml-module", NVML, "--energy-window-s", "0.3", "-o",
                   str(tmp_path / "step.trace.json"), "--", *one_rank, *GPT_DDP, "--steps", "600"],
                  _environment(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert load_trace(tmp_path / "step.trace.json").meta.measurements["world_size"] == 1
    assert not list(tmp_path.glob("step.rank*"))


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "controlled"])
def test_every_rank_controls_its_own_gpu_in_lockstep(job: Path, dry_run: bool) -> None:
    done = subprocess.run(_run_argv(job, 300, dry_run), capture_output=True, text=True, cwd=REPO_ROOT,
                          env=_environment(job), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["dry_run"] is dry_run and summary["gpu_restored"] is True and summary["error"] is None
    assert [(r["rank"], r["gpu_index"]) for r in summary["ranks"]] == [(0, 0), (1, 1)]
    assert summary["steps"] == 300 and summary["controlled_steps"] > 0
    assert summary["switches"] == sum(r["switches"] for r in summary["ranks"])
    decisions = [[(s["step"], s["next_controlled"], s["arm"]) for s in _records(job, rank, "step")] for rank in RANKS]
    assert decisions[0] == decisions[1]
    starts = [_records(job, rank, "start")[0] for rank in RANKS]
    assert all(f"plan.rank{rank}.json" in start["source"] for rank, start in zip(RANKS, starts, strict=True))
    assert _locks(job, 0) == {} and _locks(job, 1) == {}


def test_killing_one_rank_leaves_no_gpu_of_the_job_locked(job: Path) -> None:
    folder = job / "kill"
    folder.mkdir()
    for name in ("plan.rank0.json", "plan.rank1.json", "step.rank0.trace.json", "step.rank1.trace.json"):
        (folder / name).write_bytes((job / name).read_bytes())
    process = subprocess.Popen(_run_argv(folder, 100_000, dry_run=False), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, cwd=REPO_ROOT, env=_environment(folder))
    try:
        assert _wait(lambda: _locks(folder, 0) and _locks(folder, 1), 60), "no rank locked its GPU"
        os.kill(_records(folder, 1, "start")[0]["pid"], signal.SIGKILL)
        assert _wait(lambda: not _locks(folder, 0) and not _locks(folder, 1), 30), (_locks(folder, 0),
                                                                                   _locks(folder, 1))
        process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode != 0
