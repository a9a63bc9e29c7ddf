"""The online policy against its replayed schedule and the latency-optimal plan, on the disturbed fake GPU.

    python -m benchmarks.fake_gpu.online [--seeds 20] [--seconds 60] [--jobs 2] [--name NAME]
        [--methods online replayed latency-optimal residual] [--anchors N] [--budget 0.01] [--gpus h200 b200]
    # writes benchmarks/results/online_fake_gpu.{json,md} (or NAME.{json,md})

Per GPU profile (H200, B200), held-out workload and seed, runs under the same seeded disturbances with the
default controller at a 1% budget (``--budget``): ``online`` (the shipped policy deciding inside every step),
``replayed`` (its noise-free rollout as a fixed schedule), ``latency-optimal``, and ``residual`` (a residual
policy of ``KernelDVFSResidual-v0``, ``RESIDUAL_POLICY``, deciding inside every step; not a default method). Each
run's result is what the controller measured and the truth (:func:`kdvfs.runtime.testing.ab_truth.true_effect`),
and an online method's decision times on this CPU (the policy's evaluations, and every decision point). Targets:
online within budget in >= 95% of runs, and its mean measured saving within budget >= the other two's. Method:
``docs/design/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.provenance import RESULTS, provenance, provenance_lines, write_results
from kdvfs.agents.common.problem import Problem, within_budget
from kdvfs.agents.learned.training.ppo import load_train_config
from kdvfs.agents.planners.registry import make_planner
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.drift import DriftModel
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.format import save_trace
from kdvfs.runtime.cli.offline.plan import schedule_json
from kdvfs.runtime.controller import Controller
from kdvfs.runtime.controller.measurement.estimator import Paired
from kdvfs.runtime.testing.ab_truth import true_effect
from kdvfs.runtime.testing.fake_gpu import FakeGpu, FakeStepTimeline, VirtualClock

BUDGET = 0.01
DURATION_NOISE = 0.02
ANCHORS_PER_STEP = 48
METHODS = ("online", "replayed", "latency-optimal", "residual")
ONLINE_METHODS = ("online", "residual")
RESIDUAL_POLICY = "benchmarks/data/learned/{gpu}-s0.kdvfs-policy.npz"
"""The residual policy of each GPU (constrained PPO, training seed 0; ``benchmarks/learned/learned_vs_plans.py``)."""
CASES = {"h200": ("h200/gpt2s-b16", "h200/resnet50-b128"), "b200": ("gpt2s", "bert-base")}


@dataclass(frozen=True)
class Case:
    """One workload on one GPU: its trace file, the shipped policy, the latency-optimal plan file and the residual
    policy."""

    gpu: str
    step: str
    trace: Path
    policy: Path
    plan: Path
    residual: Path
    budget: float = BUDGET


def prepare(folder: Path, budget: float = BUDGET, gpus: tuple[str, ...] = tuple(CASES)) -> list[Case]:
    """Each case's trace (held-out steps of the GPU's policy) and latency-optimal plan at ``budget``, written to
    ``folder``, for ``gpus``."""
    cases = []
    for gpu, steps in ((gpu, CASES[gpu]) for gpu in gpus):
        profile = load_profile(gpu)
        traces = dict(load_train_config(gpu).data.held_out.traces(profile))
        for step in steps:
            name = step.replace("/", "-")
            trace_path = folder / f"{gpu}-{name}.trace.json"
            save_trace(traces[step], trace_path)
            problem = Problem.build(traces[step], profile, budget)
            plan_path = folder / f"{gpu}-{name}.plan.json"
            plan_path.write_text(json.dumps(schedule_json(problem, make_planner("latency-optimal").plan(problem))))
            cases.append(Case(gpu, step, trace_path, Path(f"policies/{gpu}.kdvfs-policy.npz"), plan_path,
                              Path(RESIDUAL_POLICY.format(gpu=gpu)), budget))
    return cases


def run(case: Case, method: str, seed: int, seconds: float, anchors: int = ANCHORS_PER_STEP) -> dict[str, Any]:
    """One controlled run; its measured and true effect and the controller's figures (``anchors``: about this many
    anchors per step)."""
    profile = load_profile(case.gpu)
    problem = Problem.build(open_trace(str(case.trace)), profile, case.budget)
    clock = VirtualClock()
    gpu = FakeGpu(problem.costs, profile, problem.latency_s, problem.stall_s, clock, drift=DriftModel(seed=seed),
                  latency_std_s=profile.switching.latency_std_s, duration_noise=DURATION_NOISE, seed=seed)
    every = max(1, problem.costs.kernels // anchors)
    timeline = FakeStepTimeline(gpu, clock, tuple(range(every, problem.costs.kernels, every)))
    source = {"latency-optimal": case.plan, "residual": case.residual}.get(method, case.policy)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "run.jsonl"
        controller = Controller(str(source), str(case.trace), device=gpu, timeline=timeline, clock=clock,
                                budget=case.budget, energy_read_every_s=0.0, ab_seed=seed,
                                online=method in ONLINE_METHODS,
                                log=str(log))
        with controller:
            while clock.now_s() < seconds:
                for _ in range(10):
                    controller.step()
                controller.flush()
        windows = [r for r in map(json.loads, log.read_text().splitlines()) if r["event"] == "window"]
    summary = controller.summary
    assert summary is not None
    truth, measured = true_effect(gpu, windows), summary.measured
    return {"gpu": case.gpu, "step": case.step, "method": method, "seed": seed,
            "measured_saved_pct": measured.energy_saved_pct, "measured_slowdown_pct": measured.slowdown_pct,
            "slowdown_ci95_pct": measured.slowdown_ci95_pct,
            "within_budget": measured.slowdown_pct is not None
            and within_budget(measured.slowdown_pct, case.budget), "source": summary.source,
            "true_saved_pct": None if truth is None else truth.energy_saved_pct,
            "true_slowdown_pct": None if truth is None else truth.slowdown_pct,
            "steps": summary.steps, "controlled_steps": summary.controlled_steps, "switches": summary.switches,
            "backed_off": summary.backed_off, "error": summary.error,
            "online": None if summary.online is None else summary.online.to_json()}


def _job(arguments: tuple[Case, str, int, float, int]) -> dict[str, Any]:
    return run(*arguments)


def figures(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per GPU, step and method: compliance, mean saving (all runs and those within budget), the truth."""
    rows = []
    for key in sorted({(r["gpu"], r["step"], r["method"]) for r in runs}, key=lambda k: (k[0], k[1],
                                                                                        METHODS.index(k[2]))):
        group = [r for r in runs if (r["gpu"], r["step"], r["method"]) == key]
        within = [r for r in group if r["within_budget"]]

        def mean(values: list[Any]) -> float | None:
            kept = [v for v in values if v is not None]
            return float(np.mean(kept)) if kept else None

        rows.append({"gpu": key[0], "step": key[1], "method": key[2], "runs": len(group),
                     "within_budget": len(within) / len(group),
                     "saved_pct": mean([r["measured_saved_pct"] for r in group]),
                     "saved_within_pct": mean([r["measured_saved_pct"] for r in within]),
                     "slowdown_pct": mean([r["measured_slowdown_pct"] for r in group]),
                     "true_saved_pct": mean([r["true_saved_pct"] for r in group]),
                     "true_slowdown_pct": mean([r["true_slowdown_pct"] for r in group]),
                     "switches": mean([r["switches"] for r in group]),
                     "policy_wakes_per_step": mean([r["online"]["wakes"].get("policy", 0)
                                                    / max(r["controlled_steps"], 1) for r in group if r["online"]]),
                     "decisions_per_step": mean([r["online"]["decisions"] / max(r["controlled_steps"], 1)
                                                 for r in group if r["online"]]),
                     "decision_us_median": mean([r["online"]["decision_us"]["median"] for r in group if r["online"]]),
                     "decision_point_us_median": mean([r["online"]["decision_point_us"]["median"] for r in group
                                                       if r["online"]]),
                     "decision_point_us_p99": mean([r["online"]["decision_point_us"]["p99"] for r in group
                                                    if r["online"]]),
                     "backed_off": sum(r["backed_off"] for r in group)})
    return rows


def verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets per GPU and step (where ``online`` ran with both references)."""
    out = []
    for gpu, step in sorted({(r["gpu"], r["step"]) for r in rows}):
        by = {r["method"]: r for r in rows if (r["gpu"], r["step"]) == (gpu, step)}
        if not {"online", "replayed", "latency-optimal"} <= set(by):
            continue
        online = by["online"]
        beats = {m: online["saved_within_pct"] is not None and (by[m]["saved_within_pct"] is None or
                                                               online["saved_within_pct"] >= by[m]["saved_within_pct"])
                 for m in ("replayed", "latency-optimal")}
        out.append({"gpu": gpu, "step": step, "compliance_met": online["within_budget"] >= 0.95,
                    "beats_replayed": beats["replayed"], "beats_latency_optimal": beats["latency-optimal"]})
    return out


PAIRS = (("online", "replayed"), ("residual", "online"))
"""The methods compared seed by seed (:func:`paired_gains`), where both ran."""


def paired_gains(runs: list[dict[str, Any]], method: str = "online", against: str = "replayed") -> list[dict[str, Any]]:
    """Per GPU and step: ``method`` minus ``against`` measured saving, seed by seed (the same disturbances),
    its mean with a 95% t interval (points) and the seeds where ``method`` saved more."""
    by = {(r["gpu"], r["step"], r["method"], r["seed"]): r["measured_saved_pct"] for r in runs}
    out = []
    for gpu, step in sorted({(r["gpu"], r["step"]) for r in runs}):
        seeds = sorted(s for g, st, m, s in by if (g, st, m) == (gpu, step, method))
        diffs = np.array([by[(gpu, step, method, s)] - by[(gpu, step, against, s)] for s in seeds
                          if by[(gpu, step, method, s)] is not None and by[(gpu, step, against, s)] is not None])
        paired = Paired()
        for diff in diffs:
            paired.add(float(diff))
        found = paired.interval()
        low, high = (math.nan, math.nan) if found is None else (found.lo_pct, found.hi_pct)
        out.append({"gpu": gpu, "step": step, "mean_pts": float(diffs.mean()), "lo_pts": low, "hi_pts": high,
                    "more": int((diffs > 0).sum()), "seeds": len(diffs)})
    return out


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(document: dict[str, Any]) -> str:
    args = document["settings"]
    lines = ["# Online policy on the disturbed fake GPU", "", *provenance_lines(document["provenance"]), "",
             f"{args['seeds']} seeds x {args['seconds']:g} simulated s per run, "
             f"{args.get('anchors', ANCHORS_PER_STEP)} anchors per step, {100 * args.get('budget', BUDGET):g}% budget, "
             "default controller "
             "(A/B windows of 10 steps and 0.5 s, `ab_share` 0.25, guard margin 0.5%); disturbances: latency "
             "drawn from the profile's spread per request, 2% lognormal duration noise per kernel, drift model "
             "(+2.1% over 120 s, per-step jitter). Savings and slowdowns are the controller's own measurement "
             "(B against A windows, %); `true` is the fake's truth. `within` = share of runs whose measured "
             "slowdown is within the budget; `saved (within)` = mean measured saving over those runs. Online "
             "methods: policy evaluations per controlled step, their median time, and every decision point's "
             "median and p99 (us on this CPU, means over runs; decision points include the look-ahead).", "",
             "| GPU | step | method | within | saved | saved (within) | slowdown | true saved | true slowdown "
             "| switches | back-offs | policy wakes per controlled step | decisions per step | decision median us "
             "| decision point median / p99 us |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in document["figures"]:
        lines.append(f"| {r['gpu']} | {r['step']} | {r['method']} | {r['within_budget']:.0%} | "
                     f"{_cell(r['saved_pct'])} | {_cell(r['saved_within_pct'])} | {_cell(r['slowdown_pct'])} | "
                     f"{_cell(r['true_saved_pct'])} | {_cell(r['true_slowdown_pct'])} | {_cell(r['switches'], 1)} | "
                     f"{r['backed_off']} | {_cell(r.get('policy_wakes_per_step'), 1)} | "
                     f"{_cell(r.get('decisions_per_step'), 1)} | {_cell(r.get('decision_us_median'), 1)} | "
                     f"{_cell(r.get('decision_point_us_median'), 1)} / {_cell(r.get('decision_point_us_p99'), 0)} |")
    if document["verdicts"]:
        lines += ["", "| GPU | step | online within budget in >= 95% | saving >= replayed | saving >= "
                  "latency-optimal |", "| --- | --- | --- | --- | --- |"]
    for v in document["verdicts"]:
        lines.append(f"| {v['gpu']} | {v['step']} | " + " | ".join(
            "met" if v[k] else "NOT met" for k in ("compliance_met", "beats_replayed", "beats_latency_optimal"))
            + " |")
    ran = {r["method"] for r in document["runs"]}
    for method, against in (pair for pair in PAIRS if set(pair) <= ran):
        lines += ["", f"{method} minus {against} measured saving, paired by seed (same disturbances), mean with 95% "
                  "t interval:", "", f"| GPU | step | {method} - {against} (points) | seeds where {method} saved "
                  "more |", "| --- | --- | --- | ---: |"]
        for g in paired_gains(document["runs"], method, against):
            lines.append(f"| {g['gpu']} | {g['step']} | {g['mean_pts']:+.3f} [{g['lo_pts']:+.3f}, "
                         f"{g['hi_pts']:+.3f}] | {g['more']}/{g['seeds']} |")
    return "\n".join([*lines, ""])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0, help="simulated seconds per run")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=["online", "replayed", "latency-optimal"],
                        help="residual: a residual policy (RESIDUAL_POLICY) deciding online")
    parser.add_argument("--anchors", type=int, default=ANCHORS_PER_STEP,
                        help="anchors per step, evenly spaced over its kernels (as hooks at every N-th block: "
                             "the controller's anchor_every)")
    parser.add_argument("--budget", type=float, default=BUDGET, help="the run's budget (fraction)")
    parser.add_argument("--gpus", nargs="+", choices=tuple(CASES), default=list(CASES))
    parser.add_argument("--name", default="online_fake_gpu", help="results file stem")
    args = parser.parse_args(argv)
    if args.anchors < 1:
        parser.error("--anchors N needs N >= 1")
    methods = [m for m in METHODS if m in args.methods]
    with tempfile.TemporaryDirectory() as tmp:
        cases = prepare(Path(tmp), args.budget, tuple(args.gpus))
        jobs = [(case, method, seed, args.seconds, args.anchors) for case in cases
                for seed in range(args.seeds) for method in methods]
        runs = []
        with ProcessPoolExecutor(args.jobs) as pool:
            for i, result in enumerate(pool.map(_job, jobs), 1):
                runs.append(result)
                print(f"[{i}/{len(jobs)}] {result['gpu']} {result['step']} {result['method']} seed {result['seed']}: "
                      f"saved {_cell(result['measured_saved_pct'])}% slowdown "
                      f"{_cell(result['measured_slowdown_pct'])}%", file=sys.stderr, flush=True)
    rows = figures(runs)
    document = {"provenance": provenance("python -m benchmarks.fake_gpu.online " + " ".join(argv)),
                "settings": vars(args), "figures": rows, "verdicts": verdicts(rows), "runs": runs}
    write_results(args.name, document, markdown(document), folder=RESULTS)
    print(markdown(document))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
