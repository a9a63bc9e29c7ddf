"""How often the controller's thread wakes and what its decision points cost, on the fake H200 (dry run).

    python -m benchmarks.fake_gpu.wakes run OUT.json [--label NAME] [--seconds 30]   # with this checkout's kdvfs
    python -m benchmarks.fake_gpu.wakes report A.json B.json [--name wakes_fake_gpu]  # benchmarks/results/NAME.*

``run`` drives the default controller (the shipped H200 policy deciding online, A/B windows, a dry run) through
``--seconds`` simulated seconds of each workload of ``CASES`` on the fake H200 (virtual clock; about
``ANCHORS_PER_STEP`` anchors a step), and counts per step the thread's sleeps on its clock (each a wake), its
decision points by reason and the CPU time of their work (the thread's own, ``time.thread_time``: the fake
GPU's simulation, which runs on the same thread while it waits, is outside them). Whichever kdvfs is first on
``PYTHONPATH`` runs, so the same script measures an earlier revision (``git archive REV | tar -x -C DIR``, then
``PYTHONPATH=DIR``) beside this one; ``report`` puts the runs side by side. The figures are this CPU's and the
fake GPU's: what changes between revisions is the count of wakes and decision points, not a GPU's step time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
from pathlib import Path
from typing import Any

import kdvfs
from benchmarks.common.provenance import RESULTS, provenance, provenance_lines, write_results
from kdvfs.agents.common.problem import Problem
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.runtime.controller import Controller
from kdvfs.runtime.controller.config import MeasurementConfig
from kdvfs.runtime.testing.fake_gpu import FakeGpu, FakeStepTimeline, VirtualClock

CASES = ("h200/capture-gpt3xl-b4", "h200/gpt2s-b16")
ANCHORS_PER_STEP = 48
POLICY = "policies/h200.kdvfs-policy.npz"


class CountingClock(VirtualClock):
    """A virtual clock that counts the sleeps for a time still ahead (each a wake of the sleeper)."""

    sleeps = 0

    def sleep_until(self, time_s: float, stop: threading.Event) -> bool:
        if time_s > self.now_s():
            self.sleeps += 1
        return super().sleep_until(time_s, stop)


def run_case(trace: str, seconds: float) -> dict[str, Any]:
    """One dry run of ``trace`` on the fake H200; its per-step figures."""
    profile = load_profile("h200")
    problem = Problem.build(open_trace(trace), profile, 0.01)
    clock = CountingClock()
    gpu = FakeGpu(problem.costs, profile, problem.latency_s, problem.stall_s, clock)
    every = max(1, problem.costs.kernels // ANCHORS_PER_STEP)
    timeline = FakeStepTimeline(gpu, clock, tuple(range(every, problem.costs.kernels, every)))
    energy = {"energy_read_every_s" if "energy_read_every_s" in {f.name for f in dataclasses.fields(
        MeasurementConfig)} else "energy_poll_s": 0.0}
    controller = Controller(POLICY, trace, device=gpu, timeline=timeline, clock=clock, dry_run=True, **energy)
    with controller:
        while clock.now_s() < seconds:
            for _ in range(10):
                controller.step()
            controller.flush()
    assert controller.summary is not None
    typed = hasattr(controller.summary, "to_json")  # this revision's typed summary, or an earlier one's dict
    summary = controller.summary.to_json() if typed else controller.summary
    online, steps, controlled = summary["online"], summary["steps"], summary["controlled_steps"]
    points = sum(online["wakes"].values())
    return {"trace": trace, "kernels": problem.costs.kernels, "steps": steps, "controlled_steps": controlled,
            "wakes_per_controlled_step": clock.sleeps / controlled,
            "decision_points_per_controlled_step": points / controlled,
            "by_reason_per_controlled_step": {r: n / controlled for r, n in online["wakes"].items()},
            "evaluations_per_controlled_step": online["decisions"] / controlled,
            "requests_per_controlled_step": online["requests"] / controlled,
            "decision_point_cpu_ms_per_controlled_step": online["cpu_ms"] / controlled,
            "warm_ms_per_controlled_step": (online.get("warm_ms") or 0.0) / controlled,
            "decision_us": online["decision_us"], "lookahead_points_per_controlled_step":
            online.get("lookahead_points", 0) / controlled}


def markdown(document: dict[str, Any]) -> str:
    lines = ["# The controller's thread on the fake H200: wakes and decision points per controlled step", "",
             *provenance_lines(document), "",
             "Dry runs of the shipped H200 policy deciding online on the fake GPU (virtual clock); per controlled "
             "step: the thread's wakes (sleeps on its clock), its decision points (by reason), the policy's "
             "evaluations, requests, the CPU of the decision points' work and of the warm-ups before them (this "
             "CPU), and the states read ahead.", "",
             "| run | code | workload (kernels) | wakes | decision points (by reason) | evaluations | requests | "
             "decision points' CPU (ms) | warm-ups' CPU (ms) | states read ahead | decision median (us) |",
             "| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for run in document["runs"]:
        for c in run["cases"]:
            reasons = ", ".join(f"{r} {n:.1f}" for r, n in sorted(c["by_reason_per_controlled_step"].items()))
            lines.append(f"| {run['label']} | {run['code']} | {c['trace']} ({c['kernels']}) | "
                         f"{c['wakes_per_controlled_step']:.1f} | {c['decision_points_per_controlled_step']:.1f} "
                         f"({reasons}) | {c['evaluations_per_controlled_step']:.1f} | "
                         f"{c['requests_per_controlled_step']:.1f} | "
                         f"{c['decision_point_cpu_ms_per_controlled_step']:.2f} | "
                         f"{c['warm_ms_per_controlled_step']:.2f} | {c['lookahead_points_per_controlled_step']:.1f} | "
                         f"{c['decision_us']['median']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run")
    run.add_argument("out", type=Path)
    run.add_argument("--label", default="this checkout")
    run.add_argument("--code", default="", help="the revision of the kdvfs that runs (for the report)")
    run.add_argument("--seconds", type=float, default=30.0)
    report = sub.add_parser("report")
    report.add_argument("runs", type=Path, nargs="+")
    report.add_argument("--name", default="wakes_fake_gpu")
    args = parser.parse_args(argv)
    if args.what == "run":
        cases = [run_case(trace, args.seconds) for trace in CASES]
        args.out.write_text(json.dumps({"label": args.label, "code": args.code, "kdvfs": kdvfs.__file__,
                                        "seconds": args.seconds, "cases": cases}, indent=1))
        return 0
    runs = [json.loads(path.read_text()) for path in args.runs]
    document = {**provenance(" ; ".join(f"python -m benchmarks.fake_gpu.wakes run {p.name} --label '{r['label']}' "
                                        f"--code {r['code']} --seconds {r['seconds']:g}" for p, r in
                                        zip(args.runs, runs, strict=True))
                             + f" ; python -m benchmarks.fake_gpu.wakes report ... --name {args.name}"),
                "runs": runs}
    write_results(args.name, document, markdown(document), indent=1, folder=RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
