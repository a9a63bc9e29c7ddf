"""The controller thread's CPU with the online policy, on the fake GPU: per wake, and what its log records cost.

    python benchmarks/controller_thread_cpu.py [--steps 200] [--runs 4] [--thread-only] [--out DIR] [--name N]
    # writes benchmarks/results/controller_thread_cpu.{json,md} (or DIR/N.*)

A dry run of the shipped H200 policy on a fake H200 (virtual clock, drift seed 1) over the bundled GPT-3 XL
one-layer step at a 5% budget and 2 ms switching, ``--steps`` steps, ``--runs`` times for each of: online with
its JSONL log, online without a log, replayed (``online=false``) with and without. Each run's controller
thread CPU (``controller_cpu_ms.thread``), the online decisions' own part (``online.cpu_ms``), the wakes
and the policy runs. On a launch-bound training loop this thread's CPU holds the interpreter lock the loop
waits for (``docs/controller.md``, "A cold core"). Then, unless ``--thread-only``, what one online
decision's log record costs to append and encode: as a dict through ``EventLog.append`` and ``json.dumps``,
and as the line of ``DecisionRecords`` through ``EventLog.append_line`` (us per record). No GPU needed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from provenance import RESULTS, provenance, provenance_lines, write_results

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.policy_planner import shipped_policy_path
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.drift import DriftModel
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.runtime.controller import Controller
from kdvfs.runtime.controller.actuator import EventLog
from kdvfs.runtime.testing.fake_gpu import FakeGpu, FakeStepTimeline, VirtualClock

TRACE, BUDGET, LATENCY_MS = "h200/gpt3xl-1layer-b4", 0.05, 2.0
ARMS = {"online, logged": (True, True), "online, no log": (True, False), "replayed, logged": (False, True),
        "replayed, no log": (False, False)}
RECORDS = 20_000


def thread_cpu(online: bool, logged: bool, steps: int) -> dict[str, Any]:
    """One dry run's controller-thread figures."""
    problem = Problem.build(open_trace(TRACE), load_profile("h200"), BUDGET, LATENCY_MS / 1e3)
    clock = VirtualClock()
    gpu = FakeGpu(problem.costs, problem.profile, problem.latency_s, problem.stall_s, clock, drift=DriftModel(seed=1))
    timeline = FakeStepTimeline(gpu, clock, tuple(range(8, problem.costs.kernels - 3, 8)))
    with tempfile.TemporaryDirectory() as folder:
        controller = Controller(str(shipped_policy_path("h200")), TRACE, device=gpu, timeline=timeline, clock=clock,
                                latency_ms=LATENCY_MS, budget=BUDGET, window_steps=5, window_s=0.1,
                                energy_poll_s=0.0, issue_early_ms=0.0, ab_share=0.0, dry_run=True, online=online,
                                log=str(Path(folder) / "run.jsonl") if logged else None)
        with controller:
            for _ in range(steps):
                controller.step()
                controller.flush()
    summary = controller.summary
    assert summary is not None and summary["error"] is None, summary
    decisions = summary["online"] or {}
    return {"thread_ms": summary["controller_cpu_ms"]["thread"], "online_ms": decisions.get("cpu_ms"),
            "wakes": sum((decisions.get("wakes") or {}).values()), "policy_runs": decisions.get("decisions", 0),
            "controlled_steps": summary["controlled_steps"]}


def record_costs(folder: Path) -> dict[str, float]:
    """One decision record's append-and-encode time (us): as a dict through ``EventLog.append`` (labels looked up,
    the action listed, encoded by ``json.dumps``) and as a ``DecisionRecords`` line through
    ``EventLog.append_line``; both from the same arguments, written to a file at the end."""
    from kdvfs.runtime.controller.decision_records import DecisionRecords  # not in code before 61c8b8b

    labels = tuple(f"{core}:3201" for core in range(1185, 1981, 15))
    records = DecisionRecords(labels)
    figures = (1.0, 0.12345679104328156, 1.2345678806304932)
    result = {}
    for name in ("dict and json.dumps", "DecisionRecords line"):
        log = EventLog(folder / "records.jsonl")
        began = time.perf_counter()
        for step in range(RECORDS):
            if name == "DecisionRecords line":
                log.append_line(records.line(step, 57, "anchor", 3, None, *figures, (1, 14, 0), 5, 17.123456001281738,
                                             "policy"))
            else:
                log.append("decision", step=step, kernel=57, source="anchor", in_effect=labels[3], pending=None,
                           budget_pct=figures[0], budget_used=figures[1], affordable_pct=figures[2],
                           action=list((1, 14, 0)), clocks=labels[5], wall_us=17.123456001281738, next_wake="policy")
        log.close()
        result[name] = 1e6 * (time.perf_counter() - began) / RECORDS
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--thread-only", action="store_true", help="skip the log records' costs (for code "
                        "before DecisionRecords)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the results files")
    parser.add_argument("--name", default="controller_thread_cpu", help="results file stem")
    args = parser.parse_args(argv)
    arms = {name: [thread_cpu(online, logged, args.steps) for _ in range(args.runs)]
            for name, (online, logged) in ARMS.items()}
    with tempfile.TemporaryDirectory() as folder:
        records = None if args.thread_only else record_costs(Path(folder))
    document = {"provenance": provenance("python benchmarks/controller_thread_cpu.py " + " ".join(argv)),
                "trace": TRACE, "steps": args.steps, "arms": arms, "record_us": records}
    write_results(args.name, document, markdown(document), folder=args.out)
    print(markdown(document))
    return 0


def markdown(document: dict[str, Any]) -> str:
    lines = ["# The controller thread's CPU with the online policy (fake GPU)", "",
             *provenance_lines(document["provenance"]), "",
             f"Dry runs of the shipped H200 policy on `{document['trace']}`, {document['steps']} steps each; per "
             "arm, each run's figures.", "",
             "| arm | thread CPU (ms) | online decisions' part (ms) | wakes | policy runs | controlled steps |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, runs in document["arms"].items():
        thread = ", ".join(f"{r['thread_ms']:.0f}" for r in runs)
        online = ", ".join(f"{r['online_ms']:.0f}" for r in runs if r["online_ms"] is not None) or "-"
        lines.append(f"| {name} | {thread} | {online} | {runs[0]['wakes']} | {runs[0]['policy_runs']} | "
                     f"{runs[0]['controlled_steps']} |")
    median = {name: float(np.median([r["thread_ms"] for r in runs])) for name, runs in document["arms"].items()}
    first = document["arms"]["online, logged"][0]
    per_wake_us = 1e3 * (median["online, logged"] - median["replayed, logged"]) / max(first["wakes"], 1)
    per_record_us = 1e3 * (median["online, logged"] - median["online, no log"]) / max(first["policy_runs"], 1)
    lines += ["", f"Online over replayed, logged: {per_wake_us:.1f} us of thread CPU per wake (medians); the log, "
              f"online: {per_record_us:.1f} us per policy run."]
    if document["record_us"] is not None:
        lines += ["", "One decision record, appended and encoded (us): " + ", ".join(
            f"{name} {us:.2f}" for name, us in document["record_us"].items()) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
