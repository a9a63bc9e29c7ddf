"""What a bucket met mid-run costs the training process: preparing its online policy, beside a training loop.

    python -m benchmarks.fake_gpu.bucket_prep run OUT.json [--label NAME] [--rounds 3]   # this kdvfs
    python -m benchmarks.fake_gpu.bucket_prep report A.json B.json [--name bucket_prep_fake_gpu]

In a run whose steps vary, a shape bucket met for the first time is planned on worker processes, then its frozen
policy is prepared on the shape book's thread inside the training process
(:func:`~kdvfs.runtime.controller.shapes.bucket_decisions.bucket_policy`), where whatever holds the interpreter
lock holds up the training loop. ``run`` prepares the shipped H200 policy over a generated 12-layer GPT-2 small
step of each of ``SEQS`` tokens, ``--rounds`` times, on a thread, while the main thread runs a training-like
loop (``LOOP_WORK`` additions of Python, then ``LOOP_WAIT_S`` without the lock, as a GPU wait), and records the
preparation's CPU and wall time and the loop's mean and worst iteration beside it and alone. The lock held up
the loop for about (period beside / period alone - 1) x the preparation's wall time. Whichever kdvfs is first on
``PYTHONPATH`` runs, so the same script measures an earlier revision (``git archive REV | tar -x -C DIR``, then
``PYTHONPATH=DIR``); ``report`` puts the runs side by side. Figures are this CPU's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import kdvfs
from benchmarks.common.provenance import RESULTS, provenance, provenance_lines, write_results
from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.policy.deciders import online_decider
from kdvfs.agents.learned.policy.frozen import FrozenPolicy
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.synthetic.generator import generate_transformer_trace, load_workload
from kdvfs.runtime.controller.shapes.bucket_decisions import bucket_policy

POLICY = "policies/h200.kdvfs-policy.npz"
SEQS = (192, 320, 448)
LAYERS, BATCH, BUDGET, LATENCY_S = 12, 2, 0.01, 0.002
LOOP_WORK, LOOP_WAIT_S = 300, 5e-4
ALONE_S = 1.5


def _problem(seq: int) -> Problem:
    config = replace(load_workload("gpt2s"), layers=LAYERS, seq=seq, batch=BATCH, name=f"gpt2s-l{LAYERS}-s{seq}")
    profile = load_profile("h200")
    return Problem.build(generate_transformer_trace(config, profile), profile, BUDGET, LATENCY_S)


def _loop(until: threading.Event | None) -> tuple[float, float]:
    """The training-like loop, until ``until`` is set (None: for ``ALONE_S``): its mean and worst period (s)."""
    began, worst, count = time.perf_counter(), 0.0, 0
    while (until is None and time.perf_counter() - began < ALONE_S) or (until is not None and not until.is_set()):
        start = time.perf_counter()
        total = 0
        for i in range(LOOP_WORK):
            total += i
        time.sleep(LOOP_WAIT_S)
        worst, count = max(worst, time.perf_counter() - start), count + 1
    return (time.perf_counter() - began) / count, worst


def _round(online: Any, problems: list[Problem]) -> dict[str, float]:
    """One round: the loop alone, then beside the preparation of every problem's policy (per bucket)."""
    alone_s, alone_worst_s = _loop(None)
    done, cpu_s = threading.Event(), []

    def prepare() -> None:
        began = time.thread_time()
        for problem in problems:
            bucket_policy(online, problem)
        cpu_s.append(time.thread_time() - began)
        done.set()

    began = time.perf_counter()
    threading.Thread(target=prepare).start()
    beside_s, beside_worst_s = _loop(done)
    wall_s = (time.perf_counter() - began) / len(problems)
    return {"alone_period_us": 1e6 * alone_s, "alone_worst_ms": 1e3 * alone_worst_s,
            "beside_period_us": 1e6 * beside_s, "beside_worst_ms": 1e3 * beside_worst_s,
            "prepare_cpu_ms": 1e3 * cpu_s[0] / len(problems), "prepare_wall_ms": 1e3 * wall_s,
            "held_up_ms": 1e3 * (beside_s / alone_s - 1.0) * wall_s}


def run(out: Path, label: str, rounds: int) -> None:
    problems = [_problem(seq) for seq in SEQS]
    online = online_decider(FrozenPolicy.load(Path(kdvfs.__file__).parent / POLICY, problems[0].profile), problems[0])
    bucket_policy(online, problems[0])  # compiled (or loaded from numba's cache) before anything is timed
    records = [_round(online, problems) for _ in range(rounds)]
    out.write_text(json.dumps({"label": label, "kdvfs": str(Path(kdvfs.__file__).parent),
                               "kernels": [p.costs.kernels for p in problems], "records": records}, indent=1))


def report(paths: list[Path], name: str) -> None:
    runs = [json.loads(path.read_text()) for path in paths]
    rows = [{"label": r["label"], "kernels": r["kernels"],
             **{key: statistics.median(x[key] for x in r["records"]) for key in r["records"][0]}} for r in runs]
    command = ("python -m benchmarks.fake_gpu.bucket_prep run OUT.json --label L (each revision's tree first on "
               "PYTHONPATH), then report " + " ".join(p.name for p in paths))
    result = {"provenance": provenance(command), "rows": rows}
    lines = ["# What preparing a bucket's online policy costs the training process (fake H200, this CPU)", "",
             *provenance_lines(result["provenance"]), "",
             f"Medians over rounds, per bucket (a generated {LAYERS}-layer GPT-2 small step, batch {BATCH}, of "
             f"{', '.join(map(str, SEQS))} tokens). Held up: the training-like loop's period beside the preparation "
             "over its period alone, minus one, times the preparation's wall time.", "",
             "| code | prepare CPU (ms) | prepare wall (ms) | loop period alone / beside (us) | worst iteration "
             "alone / beside (ms) | loop held up (ms) |", "| --- | ---: | ---: | --- | --- | ---: |"]
    for row in rows:
        lines.append(f"| {row['label']} | {row['prepare_cpu_ms']:.0f} | {row['prepare_wall_ms']:.0f} | "
                     f"{row['alone_period_us']:.0f} / {row['beside_period_us']:.0f} | "
                     f"{row['alone_worst_ms']:.1f} / {row['beside_worst_ms']:.1f} | {row['held_up_ms']:.0f} |")
    write_results(name, result, "\n".join(lines) + "\n", folder=RESULTS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    ran = sub.add_parser("run")
    ran.add_argument("out", type=Path)
    ran.add_argument("--label", default="this revision")
    ran.add_argument("--rounds", type=int, default=3)
    reported = sub.add_parser("report")
    reported.add_argument("paths", type=Path, nargs="+")
    reported.add_argument("--name", default="bucket_prep_fake_gpu")
    args = parser.parse_args(argv)
    if args.what == "run":
        run(args.out, args.label, args.rounds)
    else:
        report(args.paths, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
