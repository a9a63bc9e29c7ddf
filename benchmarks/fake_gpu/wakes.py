"""The controller thread's CPU, how often it wakes and what its decision points cost, on the fake H200 (dry run).

    python -m benchmarks.fake_gpu.wakes run OUT.json [--label NAME] [--seconds 30] [--policy PATH]  # this kdvfs
    python -m benchmarks.fake_gpu.wakes report A.json B.json [--name wakes_fake_gpu]  # benchmarks/results/NAME.*

``run`` drives the default controller (the shipped H200 policy, or ``--policy``'s, deciding online, A/B windows, a
dry run) through
``--seconds`` simulated seconds of each workload of ``CASES`` on the fake H200 (virtual clock; about
``ANCHORS_PER_STEP`` anchors a step; its event log written), and counts per step the thread's sleeps on its
clock (each a wake), its decision points by reason and the CPU time of their work, and the whole thread's CPU
(``time.thread_time``: everything the thread does, its accounting, anchors, warm-ups and log included, but the
fake GPU's simulation, which runs on the same thread when it looks at the GPU: :class:`FakeCpu`). A digest of
each run's event log without its timings (:func:`log_digest`) shows whether two revisions stepped, decided and
requested alike. Objects made before the steps are frozen out of the garbage collector (``gc.freeze``): a full
collection costs the whole heap's objects, not the controller's work. Whichever kdvfs is first on
``PYTHONPATH`` runs, so the same script measures an earlier revision (``git archive REV | tar -x -C DIR``, then
``PYTHONPATH=DIR``) beside this one; ``report`` puts the runs side by side. The figures are this CPU's and the
fake GPU's: what changes between revisions is the count of wakes and decision points, not a GPU's step time.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kdvfs
from benchmarks.common.provenance import RESULTS, provenance, provenance_lines, write_results
from kdvfs.agents.common.problem import Problem
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.runtime.controller import Controller
from kdvfs.runtime.controller.config import MeasurementConfig
from kdvfs.runtime.controller.event_log import read_event_log
from kdvfs.runtime.testing.fake_gpu import FakeGpu, FakeStepTimeline, VirtualClock

CASES = ("h200/capture-gpt3xl-b4", "h200/gpt2s-b16")
ANCHORS_PER_STEP = 48
POLICY = "policies/h200.kdvfs-policy.npz"


FAKE_METHODS: dict[type, tuple[str, ...]] = {
    FakeGpu: ("clocks_mhz", "power_w", "energy_j", "lock_clocks_mhz", "reset_clocks", "kernel_start_s",
              "passed_kernels", "run_step"),
    FakeStepTimeline: ("mark", "wait", "shape_of", "anchor_s", "passed_anchor")}
"""The fake GPU's and its timeline's methods: the GPU's simulation, which runs on the thread that calls them."""
THREAD = "kdvfs-controller"


class FakeCpu:
    """The CPU time (s) the controller's thread (``THREAD``) spends inside the fake GPU and its timeline (their
    simulation, no part of the controller's own work): the outermost call of each of ``FAKE_METHODS`` on that
    thread, timed with ``time.thread_time`` from the wrapper's first statement to its last: the timing's own work
    (dozens of calls a step) counts with the simulation, and only the call into the wrapper, its return and part
    of its clock reads are left in the controller's figure."""

    def __init__(self) -> None:
        self.cpu_s, self._depth = 0.0, threading.local()

    def wrap(self, target: Any) -> None:
        """Time ``target``'s methods of ``FAKE_METHODS`` (on the instance)."""
        for method in FAKE_METHODS[type(target)]:
            setattr(target, method, self._timed(getattr(target, method)))

    def _timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            began_s = time.thread_time()
            if getattr(self._depth, "n", 0) or threading.current_thread().name != THREAD:
                return method(*args, **kwargs)
            self._depth.n = 1
            try:
                return method(*args, **kwargs)
            finally:
                self._depth.n = 0
                self.cpu_s += time.thread_time() - began_s
        return timed


class CountingClock(VirtualClock):
    """A virtual clock that counts the sleeps for a time still ahead (each a wake of the sleeper)."""

    sleeps = 0

    def sleep_until(self, time_s: float, stop: threading.Event) -> bool:
        if time_s > self.now_s():
            self.sleeps += 1
        return super().sleep_until(time_s, stop)


def log_digest(log: Path) -> str:
    """A digest of an event log without what depends on this CPU's timing (the summary, the decisions' wall times,
    the process id): two runs with equal digests stepped, decided, requested and measured alike. A step record's
    arrays of times count in whole nanoseconds, as a log writes them since they are ``*_ns`` (one written earlier,
    ``*_s`` in seconds, is rounded so), so logs of either form compare."""
    records, _ = read_event_log(log)
    kept = [{_digest_key(k): _digest_value(k, v) for k, v in record.items() if k not in ("wall_us", "pid")}
            for record in records if record["event"] != "summary"]
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()[:16]


STEP_ARRAYS_S = ("anchors_s", "pace_s")
"""A step record's arrays of times as logs held them in seconds (now ``anchors_ns``, ``pace_ns``)."""


def _digest_key(key: str) -> str:
    return key[:-2] + "_ns" if key in STEP_ARRAYS_S else key


def _digest_value(key: str, value: Any) -> Any:
    return [round(t * 1e9) for t in value] if key in STEP_ARRAYS_S and value is not None else value


def run_case(trace: str, seconds: float, log: Path, policy: str = POLICY) -> dict[str, Any]:
    """One dry run of ``trace`` on the fake H200 with ``policy`` deciding online, its event log written to ``log``;
    its per-step figures."""
    profile = load_profile("h200")
    problem = Problem.build(open_trace(trace), profile, 0.01)
    clock = CountingClock()
    gpu = FakeGpu(problem.costs, profile, problem.latency_s, problem.stall_s, clock)
    every = max(1, problem.costs.kernels // ANCHORS_PER_STEP)
    timeline = FakeStepTimeline(gpu, clock, tuple(range(every, problem.costs.kernels, every)))
    fake = FakeCpu()
    fake.wrap(gpu)
    fake.wrap(timeline)
    energy: dict[str, Any] = {"energy_read_every_s" if "energy_read_every_s" in {f.name for f in dataclasses.fields(
        MeasurementConfig)} else "energy_poll_s": 0.0}
    controller = Controller(policy, trace, device=gpu, timeline=timeline, clock=clock, dry_run=True, log=str(log),
                            **energy)
    with controller:
        gc.collect()
        gc.freeze()  # a full collection costs the whole heap's objects: kept off whichever step it would land in
        while clock.now_s() < seconds:
            for _ in range(10):
                controller.step()
            controller.flush()
    assert controller.summary is not None
    typed = hasattr(controller.summary, "to_json")  # this revision's typed summary, or an earlier one's dict
    summary: dict[str, Any] = controller.summary.to_json() if typed else controller.summary  # type: ignore[assignment]
    online, steps, controlled = summary["online"], summary["steps"], summary["controlled_steps"]
    points = sum(online["wakes"].values())
    thread_ms = summary["controller_cpu_ms"]["thread"] - 1e3 * fake.cpu_s
    return {"trace": trace, "kernels": problem.costs.kernels, "steps": steps, "controlled_steps": controlled,
            "wakes_per_controlled_step": clock.sleeps / controlled,
            "thread_cpu_ms_per_controlled_step": thread_ms / controlled, "thread_cpu_ms_per_step": thread_ms / steps,
            "fake_gpu_cpu_ms_per_step": 1e3 * fake.cpu_s / steps,
            "decision_points_per_controlled_step": points / controlled,
            "by_reason_per_controlled_step": {r: n / controlled for r, n in online["wakes"].items()},
            "evaluations_per_controlled_step": online["decisions"] / controlled,
            "requests_per_controlled_step": online["requests"] / controlled,
            "decision_point_cpu_ms_per_controlled_step": online["cpu_ms"] / controlled,
            "warm_ms_per_controlled_step": (online.get("warm_ms") or 0.0) / controlled,
            "decision_us": online["decision_us"], "lookahead_points_per_controlled_step":
            online.get("lookahead_points", 0) / controlled, "log_digest": log_digest(log)}


def thread_table(runs: list[dict[str, Any]]) -> list[str]:
    """The whole thread's CPU per controlled step and the decisions' median by label and workload: median and range
    over the label's runs, and whether all of each workload's runs with the same policy logged alike (one digest a
    policy)."""
    labels = list(dict.fromkeys(run["label"] for run in runs))
    counts = {label: sum(run["label"] == label for run in runs) for label in labels}
    lines = ["| workload | " + " | ".join(f"{label}: thread CPU (ms); decisions' median (us), each median [min, max] "
                                        f"of {counts[label]} runs" for label in labels)
             + " | event logs alike (each policy's runs) |",
             "| --- |" + " ---: |" * len(labels) + " --- |"]
    for trace in CASES:
        cells, digests = [], set()
        for label in labels:
            picked = [(r, c) for r in runs if r["label"] == label for c in r["cases"] if c["trace"] == trace]
            cpu_ms = [c["thread_cpu_ms_per_controlled_step"] for _, c in picked]
            digests |= {(r.get("policy", POLICY), c["log_digest"]) for r, c in picked}
            decision_us = [c["decision_us"]["median"] for _, c in picked if c["decision_us"]["median"] is not None]
            cells.append(f"{statistics.median(cpu_ms):.2f} [{min(cpu_ms):.2f}, {max(cpu_ms):.2f}]; " + (
                f"{statistics.median(decision_us):.1f} [{min(decision_us):.1f}, {max(decision_us):.1f}]"
                if decision_us else "-"))
        alike = len(digests) == len({policy for policy, _ in digests})
        lines.append(f"| {trace} | " + " | ".join(cells) + f" | {'yes' if alike else 'no'} |")
    return lines


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def markdown(document: dict[str, Any]) -> str:
    lines = ["# The controller's thread on the fake H200: its CPU, wakes and decision points per controlled step", "",
             *provenance_lines(document), "",
             "Dry runs of a frozen H200 policy deciding online on the fake GPU (virtual clock; the shipped one, "
             "or each run's `policy` in the JSON), the event log written; per controlled step, on this CPU: the "
             "whole controller thread's CPU (all it does but the fake GPU's simulation), and whether every run's "
             "event log with the same policy, timings aside, is the same.", "",
             *thread_table(document["runs"]), "",
             "Each run: the thread's CPU, its wakes (sleeps on its clock), its decision points (by reason), the "
             "policy's evaluations, requests, the CPU of the decision points' work and of the warm-ups before them, "
             "the states read ahead, and the event log's digest.", "",
             "| run | code | workload (kernels) | thread CPU (ms) | wakes | decision points (by reason) | "
             "evaluations | requests | decision points' CPU (ms) | warm-ups' CPU (ms) | states read ahead | "
             "decision median (us) | log digest |",
             "| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for run in document["runs"]:
        for c in run["cases"]:
            reasons = ", ".join(f"{r} {n:.1f}" for r, n in sorted(c["by_reason_per_controlled_step"].items()))
            lines.append(f"| {run['label']} | {run['code']} | {c['trace']} ({c['kernels']}) | "
                         f"{c['thread_cpu_ms_per_controlled_step']:.2f} | "
                         f"{c['wakes_per_controlled_step']:.1f} | {c['decision_points_per_controlled_step']:.1f} "
                         f"({reasons}) | {c['evaluations_per_controlled_step']:.1f} | "
                         f"{c['requests_per_controlled_step']:.2f} | "
                         f"{c['decision_point_cpu_ms_per_controlled_step']:.2f} | "
                         f"{c['warm_ms_per_controlled_step']:.2f} | {c['lookahead_points_per_controlled_step']:.1f} | "
                         f"{_us(c['decision_us']['median'])} | `{c['log_digest']}` |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run")
    run.add_argument("out", type=Path)
    run.add_argument("--label", default="this checkout")
    run.add_argument("--code", default="", help="the revision of the kdvfs that runs (for the report)")
    run.add_argument("--seconds", type=float, default=30.0)
    run.add_argument("--policy", default=POLICY, help=f"the frozen policy that decides online (default {POLICY})")
    report = sub.add_parser("report")
    report.add_argument("runs", type=Path, nargs="+")
    report.add_argument("--name", default="wakes_fake_gpu")
    args = parser.parse_args(argv)
    if args.what == "run":
        with tempfile.TemporaryDirectory() as folder:
            cases = [run_case(trace, args.seconds, Path(folder) / f"{i}.jsonl", args.policy)
                     for i, trace in enumerate(CASES)]
        args.out.write_text(json.dumps({"label": args.label, "code": args.code, "kdvfs": kdvfs.__file__,
                                        "seconds": args.seconds, "policy": args.policy, "cases": cases}, indent=1))
        return 0
    runs = [json.loads(path.read_text()) for path in args.runs]
    document = {**provenance(" ; ".join(f"python -m benchmarks.fake_gpu.wakes run {p.name} --label '{r['label']}' "
                                        f"--code {r['code']} --seconds {r['seconds']:g}"
                                        + (f" --policy {r['policy']}" if r.get("policy", POLICY) != POLICY else "")
                                        for p, r in
                                        zip(args.runs, runs, strict=True))
                             + f" ; python -m benchmarks.fake_gpu.wakes report ... --name {args.name}"),
                "runs": runs}
    write_results(args.name, document, markdown(document), indent=1, folder=RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
