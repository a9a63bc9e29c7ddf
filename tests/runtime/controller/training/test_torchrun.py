"""torchrun under ``kdvfs capture`` and ``kdvfs run`` off a GPU: two gloo ranks of ``examples/gpt.py --ddp`` in
CPU test mode, one fake GPU each (the fake NVML's lock state shared through files): per-rank traces with the
job's step time and communication, per-rank plans, a dry run and a non-dry run in lockstep with one job
summary and per-rank rows, and a SIGKILL of one rank that leaves no GPU of the job locked. Then slack: a job
whose rank 1 works more per step (``imbalanced_ddp.py``) plans the waiting rank slower within the job's
budget; FSDP (one rank; two ranks and four ranks are slow). ``kdvfs plan`` runs in this process: its own
subprocess is the session capture's (``tests/runtime/conftest.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kdvfs.agents.common.problem import rank_slack_s
from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.trace import Category, noncommunication_s
from kdvfs.runtime.cli import main
from tests.runtime.controller.training.test_run_end_to_end import KDVFS, NVML, PERMISSION_SHIM, _wait
from tests.schema_check import strict_loads, validate

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone"]
GPT_DDP = [str(REPO_ROOT / "examples" / "gpt.py"), "--size", "tiny", "--device", "cpu", "--ddp"]
RANKS = (0, 1)
IMBALANCED = str(Path(__file__).with_name("imbalanced_ddp.py"))
BUDGET = 0.01


def _torchrun(ranks: int) -> list[str]:
    return [*TORCHRUN[:-2], str(ranks), "--standalone"]


def _environment(folder: Path, gpus: int = 2) -> dict[str, str]:
    shim = folder / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(PERMISSION_SHIM)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
            "KDVFS_FAKE_NVML": json.dumps({"gpus": gpus}), "KDVFS_FAKE_NVML_STATE": str(folder / "gpu.json")}


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
        assert main(["plan", "--trace", str(folder / f"step.rank{rank}.trace.json"), "--gpu", "h200", "--method",
                     "static", "--slowdown", "0.01", "-o", str(folder / f"plan.rank{rank}.json")]) == 0
    return folder


def _locks(folder: Path, gpu: int) -> dict[str, int]:
    state = folder / ("gpu.json" if gpu == 0 else f"gpu.json.gpu{gpu}")
    return dict(json.loads(state.read_text())) if state.is_file() else {}


def _run_argv(folder: Path, steps: int, dry_run: bool, ranks: int = 2, in_process: bool = False) -> list[str]:
    return [*KDVFS, "run", "--policy", str(folder / "plan.json"), "--trace", str(folder / "step.trace.json"),
            "--cpu-test-mode", "--nvml-module", NVML, "--log", str(folder / "run.jsonl"), "--json",
            *(["--dry-run"] if dry_run else []), *(["--in-process"] if in_process else []), "--", *_torchrun(ranks),
            *GPT_DDP, "--steps", str(steps)]


def _records(folder: Path, rank: int, event: str) -> list[dict[str, Any]]:
    lines = (folder / f"run.rank{rank}.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["event"] == event]


def test_each_rank_captures_its_own_trace_with_the_jobs_step_time(job: Path) -> None:
    report = strict_loads((job / "capture.json").read_text())
    validate(report, "capture")
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
    """With ``--fsdp``: the fast suite's run of the example's FSDP path (two ranks: the slow FSDP test below)."""
    one_rank = _torchrun(1)
    fsdp = [*GPT_DDP[:-1], "--fsdp"]
    done = _kdvfs(["capture", "--cpu-test-mode", "--nvml-module", NVML, "--energy-window-s", "0.3", "-o",
                   str(tmp_path / "step.trace.json"), "--", *one_rank, *fsdp, "--steps", "600"],
                  _environment(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert load_trace(tmp_path / "step.trace.json").meta.measurements["world_size"] == 1
    assert not list(tmp_path.glob("step.rank*"))


# The dry run is slow: the fast suite has the controlled job (the ranks' path) and the dry runs of one process
# (test_run_end_to_end.py::test_a_cpu_test_mode_run_matches_its_own_capture, read-only NVML calls included).
@pytest.mark.parametrize(("dry_run", "in_process"), [pytest.param(True, False, marks=pytest.mark.slow),
                                                   (False, False), (False, True)],
                         ids=["dry-run", "controlled", "controlled-in-process"])
def test_every_rank_controls_its_own_gpu_in_lockstep(job: Path, dry_run: bool, in_process: bool) -> None:
    """By default each rank's controller runs in a process of its own (the training process's share of its cost
    reported), with ``--in-process`` in the rank's training process (none); either way in the job's lockstep."""
    done = subprocess.run(_run_argv(job, 300, dry_run, in_process=in_process), capture_output=True, text=True,
                          cwd=REPO_ROOT, env=_environment(job), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = strict_loads(done.stdout)
    validate(summary, "run-summary")  # the job's summary with each rank's row
    assert (summary["host_cost"]["training_step_share_pct"] is None) is in_process
    assert summary["dry_run"] is dry_run and summary["gpu_restored"] is True and summary["error"] is None
    assert [(r["rank"], r["gpu_index"]) for r in summary["ranks"]] == [(0, 0), (1, 1)]
    assert summary["steps"] == 300 and summary["controlled_steps"] > 0
    assert summary["switches"] == sum(r["switches"] for r in summary["ranks"])
    decisions = [[(s["step"], s["next_controlled"], s["arm"]) for s in _records(job, rank, "step")] for rank in RANKS]
    assert decisions[0] == decisions[1]
    starts = [_records(job, rank, "start")[0] for rank in RANKS]
    assert all(f"plan.rank{rank}.json" in start["source"] for rank, start in zip(RANKS, starts, strict=True))
    assert _locks(job, 0) == {} and _locks(job, 1) == {}


def _parent_pid(pid: int) -> int:
    """The parent of process ``pid`` (``/proc``): a rank's training process, whose controller runs in ``pid``."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _kill_mid_job(job: Path, name: str, steps: int, victim: Callable[[int], int], timeout_s: float
                  ) -> tuple[Path, int, bytes, bytes]:
    """A controlled two-rank job of ``steps`` steps in ``job/name`` (the job's plans and traces copied there); once
    both GPUs are locked, SIGKILL to ``victim`` of rank 1's controller's pid, then both GPUs must be unlocked within
    30 s. Returns the folder, the job's exit code, stdout and stderr (within ``timeout_s``)."""
    folder = job / name
    folder.mkdir()
    for file in ("plan.rank0.json", "plan.rank1.json", "step.rank0.trace.json", "step.rank1.trace.json"):
        (folder / file).write_bytes((job / file).read_bytes())
    process = subprocess.Popen(_run_argv(folder, steps, dry_run=False), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, cwd=REPO_ROOT, env=_environment(folder),
                               start_new_session=True)  # its own process group: torchrun's ranks end with it below
    try:
        assert _wait(lambda: _locks(folder, 0) and _locks(folder, 1), 60), "no rank locked its GPU"
        os.kill(victim(_records(folder, 1, "start")[0]["pid"]), signal.SIGKILL)
        assert _wait(lambda: not _locks(folder, 0) and not _locks(folder, 1), 30), (_locks(folder, 0),
                                                                                   _locks(folder, 1))
        stdout, stderr = process.communicate(timeout=timeout_s)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # kdvfs, torchrun and any rank left, should the test fail
        process.wait()
    return folder, process.returncode, stdout, stderr


def test_killing_one_rank_leaves_no_gpu_of_the_job_locked(job: Path) -> None:
    """Rank 1's training process killed (its controller in a process of its own, the default): its controller
    process restores its GPU, and the rank that lives on closes its controller whole."""
    folder, code, stdout, _ = _kill_mid_job(job, "kill", 100_000, _parent_pid, 60)
    assert code != 0
    summary = strict_loads(stdout)  # --json: one summary also when a rank wrote none (issue 40)
    validate(summary, "run-summary")
    assert summary["partial"] and summary["error"] and summary["gpu_restored"] is True, summary
    assert 1 in [rank["rank"] for rank in summary["ranks"]], summary
    # the rank that lived on closed its controller whole, torchrun's SIGTERM meanwhile held to the end
    assert [record["gpu_restored"] for record in _records(folder, 0, "summary")] == [True]


def test_killing_one_ranks_controller_process_leaves_no_gpu_locked_and_training_goes_on(job: Path) -> None:
    """Rank 1's controller process killed (training lives on): its watchdog resets its GPU, rank 0's controller
    loses the job's lockstep and restores its own, and the job trains to its end with a summary saying so."""
    _, _, stdout, stderr = _kill_mid_job(job, "kill-controller", 4000, lambda pid: pid, 240)
    summary = strict_loads(stdout)
    validate(summary, "run-summary")
    assert summary["error"] and summary["gpu_restored"] is True, summary
    assert stderr.decode().count("4000 steps") == 2, stderr[-2000:]  # both ranks trained to the end


def _capture(folder: Path, script: list[str], ranks: int) -> dict[str, Any]:
    """``kdvfs capture`` of ``script`` under torchrun with ``ranks`` ranks into ``folder/step.rankR.trace.json``."""
    done = _kdvfs(["capture", "--cpu-test-mode", "--nvml-module", NVML, "--energy-window-s", "0.3", "--json", "-o",
                   str(folder / "step.trace.json"), "--", *_torchrun(ranks), *script], _environment(folder, ranks))
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout))


def _plan(folder: Path, rank: int, method: str, *flags: str) -> dict[str, Any]:
    """Rank ``rank``'s plan (``plan.rankR.json``, with its slack unless ``--no-slack``) as JSON."""
    out = folder / f"plan.rank{rank}{''.join(flags)}.json"
    assert main(["plan", "--trace", str(folder / f"step.rank{rank}.trace.json"), "--gpu", "h200", "--method", method,
                 "--slowdown", str(BUDGET), "-o", str(out), *flags]) == 0
    return dict(json.loads(out.read_text()))


def _job_step_within_budget(folder: Path, plans: list[dict[str, Any]], job_step_s: float) -> bool:
    """Whether the job's planned step (the longest planned time outside collectives over the ranks plus the
    least communication) is within the job's step time x (1 + budget); the longest modelled auto step where
    that is longer (profiling can lengthen a CPU trace's busy time)."""
    communication_s = [load_trace(folder / f"step.rank{rank}.trace.json").communication_s for rank in range(len(plans))]
    outside_s = max(plan["executed"]["step_time_s"] - c for plan, c in zip(plans, communication_s, strict=True))
    longest_s = max(job_step_s, *(plan["auto"]["step_time_s"] for plan in plans))
    return outside_s + min(communication_s) <= longest_s * (1 + BUDGET) * (1 + 1e-9)


def test_a_rank_that_waits_is_planned_slower_and_the_job_stays_within_its_budget(tmp_path: Path) -> None:
    report = _capture(tmp_path, [IMBALANCED, "3000"], 2)
    traces = [load_trace(tmp_path / f"step.rank{rank}.trace.json") for rank in RANKS]
    busiest_s = max(noncommunication_s(trace) for trace in traces)
    assert all(t.meta.measurements["job_max_noncommunication_s"] == pytest.approx(busiest_s) for t in traces)
    waiting, working = (rank_slack_s(trace) for trace in traces)
    assert working == 0.0 and waiting > 0.2 * traces[0].step_time_s
    plans = [_plan(tmp_path, rank, "latency-optimal") for rank in RANKS]
    assert plans[0]["slack_s"] == pytest.approx(waiting) and plans[0]["budget"] > plans[1]["budget"]
    assert plans[1]["budget"] == pytest.approx(BUDGET, rel=0.05)
    assert _job_step_within_budget(tmp_path, plans, report["job_step_time_s"])
    without = _plan(tmp_path, 0, "latency-optimal", "--no-slack")
    assert plans[0]["executed"]["energy_j"] < without["executed"]["energy_j"]
    assert plans[0]["executed"]["step_time_s"] > without["executed"]["step_time_s"]


@pytest.mark.slow
def test_four_ranks_capture_plan_with_their_slack_and_control_in_lockstep(tmp_path: Path) -> None:
    ranks = range(4)
    report = _capture(tmp_path, [*GPT_DDP, "--steps", "1000"], 4)
    assert [r["rank"] for r in report["ranks"]] == list(ranks)
    plans = [_plan(tmp_path, rank, "latency-optimal") for rank in ranks]
    assert _job_step_within_budget(tmp_path, plans, report["job_step_time_s"])
    done = subprocess.run(_run_argv(tmp_path, 200, dry_run=True, ranks=4), capture_output=True, text=True,
                          cwd=REPO_ROOT, env=_environment(tmp_path, 4), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert [(r["rank"], r["gpu_index"]) for r in summary["ranks"]] == [(rank, rank) for rank in ranks]
    assert summary["gpu_restored"] is True and summary["controlled_steps"] > 0
    decisions = [[(s["step"], s["next_controlled"], s["arm"]) for s in _records(tmp_path, rank, "step")]
                 for rank in ranks]
    assert all(decision == decisions[0] for decision in decisions)


# Slow: the fast suite covers each part of it: the example's FSDP path (the one-rank test above), collectives
# captured per rank and planned with the job's step (the ``job`` fixture, the waiting-rank test) and FSDP's
# collectives named communication (tests/envs/trace/test_classify.py).
@pytest.mark.slow
def test_an_fsdp_job_captures_its_collectives_per_rank(tmp_path: Path) -> None:
    fsdp = [*GPT_DDP[:-1], "--fsdp", "--steps", "1000"]
    report = _capture(tmp_path, fsdp, 2)
    assert {r["world_size"] for r in report["ranks"]} == {2}
    for rank in RANKS:
        trace = load_trace(tmp_path / f"step.rank{rank}.trace.json")
        names = {k.name for k in trace.kernels if k.category is Category.COMMUNICATION}
        assert {"gloo:all_gather", "gloo:all_reduce"} <= names  # unsharding; gradients (gloo: no reduce-scatter)
    plans = [_plan(tmp_path, rank, "latency-optimal") for rank in RANKS]
    assert _job_step_within_budget(tmp_path, plans, report["job_step_time_s"])
