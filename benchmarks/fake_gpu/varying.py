"""Steps that vary on the fake H200: every step planned by its shape; measured slowdown and saving vs the oracle.

    python -m benchmarks.fake_gpu.varying [--steps 600] [--seeds 3] [--jobs 2]
    # writes benchmarks/results/varying_fake_gpu.{json,md}
    python -m benchmarks.fake_gpu.varying --dry-runs 40 [--steps 300] [--first-seed 100]
    # writes benchmarks/results/varying_fake_gpu_dry.{json,md}: the A/B estimate's coverage at truth 0
    # (--first-seed: other seeds, printed only, to choose a method on)

The dynamic-padding SFT of ``examples/hf_sft.py`` on the fake H200, whose truth is the step model of all eight
Llama captures; the controller knows three captured shapes, plans every shape bucket (latency-optimal, 1%) and
measures with A/B windows. Per seed: the measured slowdown and saving (95% intervals), the share of steps
controlled, and the truth against auto and against the oracle (the plan re-solved on each executed step).
Targets: measured slowdown within the budget; truth saving >= 80% of the oracle's. ``--dry-runs``: how often
the dry runs' intervals hold 0, and their half-width. Method: ``docs/design/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.provenance import provenance, provenance_lines, write_results
from kdvfs.agents.common.problem import Planner, Problem, score
from kdvfs.agents.planners.registry import make_planner
from kdvfs.common.paths import DATA_DIR
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.drift import DriftModel
from kdvfs.envs.model.schedule import ActionCosts
from kdvfs.envs.model.step_model import StepModel
from kdvfs.envs.trace.format import load_trace, save_trace
from kdvfs.envs.trace.shape import StepShape
from kdvfs.envs.trace.trace import Trace
from kdvfs.runtime.cli.offline.plan import schedule_json
from kdvfs.runtime.controller import Controller
from kdvfs.runtime.controller.measurement.estimator import Paired
from kdvfs.runtime.controller.shapes.book import ShapeBook
from kdvfs.runtime.controller.shapes.steps import VaryingSteps
from kdvfs.runtime.testing.fake_gpu import FakeGpu, FakeStepTimeline, VirtualClock

BUDGET = 0.01
BATCH, MIN_LEN, MAX_LEN = 8, 64, 1024
DURATION_NOISE = 0.02
CONTROLLER_SHAPES = (256, 512, 1024)
WORKLOADS = DATA_DIR / "traces" / "h200" / "workloads"


def shape(seq: int) -> StepShape:
    """The example's step shape: ``attention_mask``, ``input_ids``, ``labels`` of ``[8, seq]`` (the Trainer's
    scalar ``num_items_in_batch`` left out: the captures at fixed shapes stamp these three)."""
    return StepShape.of([(BATCH, seq)] * 3)


def step_seqs(steps: int, seed: int, median_len: int | None = None) -> list[int]:
    """Each step's padded length: the longest of its batch's ``BATCH`` sample lengths (uniform, seeded; or
    log-normal with median ``median_len``, sigma 0.7, clipped to the range), rounded up to 8."""
    rng = np.random.default_rng(seed)
    if median_len is None:
        lengths = rng.integers(MIN_LEN, MAX_LEN + 1, (steps, BATCH))
        return [int(x) for x in lengths.max(axis=1)]
    lengths = np.clip(np.round(median_len * np.exp(0.7 * rng.standard_normal((steps, BATCH)))), MIN_LEN, MAX_LEN)
    return [min(MAX_LEN, int(-(-x // 8) * 8)) for x in lengths.max(axis=1)]


def models() -> tuple[StepModel, StepModel]:
    """The truth (every Llama capture) and the controller's model (its three captured shapes)."""
    llama = [load_trace(path) for path in sorted(WORKLOADS.glob("llama-*.trace.json.gz"))]
    known = [t for t in llama if t.meta.step_shape in {shape(s) for s in CONTROLLER_SHAPES}]
    return StepModel.fit(llama), StepModel.fit(known)


_TRUTH: dict[int, Trace] = {}
_COSTS: dict[int, ActionCosts] = {}
"""The executed steps' costs, by padded length (shared by the dry runs' seeds)."""


def _oracle(seq: int) -> tuple[int, float, float, float, float]:
    """The executed step's auto time and energy and the oracle's saving and slowdown (%)."""
    problem = Problem.build(_TRUTH[seq], load_profile("h200"), BUDGET)
    costs = problem.costs
    result = score(problem, make_planner("latency-optimal").plan(problem))
    return (seq, float(costs.time_s[:, costs.auto_index].sum()), float(costs.energy_j[:, costs.auto_index].sum()),
            result.energy_saved_pct, result.slowdown_pct)


def oracles(truth: StepModel, seqs: set[int], jobs: int) -> dict[int, tuple[float, float, float, float]]:
    """Per executed length: auto seconds and joules, the oracle's saving and slowdown (forked workers)."""
    _TRUTH.update({seq: truth.predict(shape(seq)) for seq in seqs})
    with ProcessPoolExecutor(jobs, get_context("fork")) as pool:
        return {seq: rest for seq, *rest in pool.map(_oracle, sorted(seqs))}


def run(seed: int, steps: int, truth: StepModel, known: StepModel,
        oracle: dict[int, tuple[float, float, float, float]]) -> dict[str, Any]:
    """One seeded run (see the module docstring)."""
    profile = load_profile("h200")
    seqs = step_seqs(steps + 1, seed)
    reference = Problem.build(known.predict(shape(1024)), profile, BUDGET)
    clock = VirtualClock()
    gpu = FakeGpu(reference.costs, profile, reference.latency_s, reference.stall_s, clock,
                  latency_std_s=profile.switching.latency_std_s, duration_noise=DURATION_NOISE, seed=seed)
    timeline = FakeStepTimeline(gpu, clock)
    costs = {seq: Problem.build(_TRUTH[seq], profile, BUDGET).costs for seq in set(seqs[:steps])}
    for i, seq in enumerate(seqs):
        timeline.shapes[i] = shape(seq)
        if i < steps:
            gpu.step_costs[i] = costs[seq]
    varying = VaryingSteps([shape(s) for s in CONTROLLER_SHAPES],
                           lambda wanted: known.predict(wanted) if known.covers(wanted) else None, timeline.shape_of)
    with tempfile.TemporaryDirectory() as folder:
        trace_path, plan_path, log = Path(folder, "step.trace.json"), Path(folder, "plan.json"), Path(folder, "log")
        save_trace(reference.trace, trace_path)
        plan_path.write_text(json.dumps(schedule_json(reference, make_planner("latency-optimal").plan(reference))))
        controller = Controller(str(plan_path), str(trace_path), device=gpu, timeline=timeline, clock=clock,
                                varying=varying, budget=BUDGET, energy_read_every_s=0.0, ab_seed=seed, log=str(log))
        with controller:
            for _ in range(steps):
                controller.step()
                controller.flush()
        windows = [r for r in map(json.loads, log.read_text().splitlines()) if r["event"] == "window"]
    summary = controller.summary
    assert summary is not None
    assert summary.shapes is not None
    return {"seed": seed, "steps": summary.steps, "controlled_steps": summary.controlled_steps,
            "planned_steps": sum(summary.shapes.steps_by_bucket.values()), "shapes": summary.shapes.to_json(),
            "measured": summary.measured.to_json(), "backed_off": summary.backed_off, "error": summary.error,
            **truth_over_b_windows(gpu, windows, seqs, oracle)}


def truth_over_b_windows(gpu: FakeGpu, windows: list[dict[str, Any]], seqs: list[int],
                         oracle: dict[int, tuple[float, float, float, float]]) -> dict[str, float]:
    """The controlled steps of fully controlled B windows: their cost-model saving and slowdown against the
    same steps at auto, and the oracle's on the same steps (%, energy- and time-weighted)."""
    steps = [i for w in windows if w["arm"] == "B" and w["controlled_steps"] == w["steps"]
             for i in range(w["first_step"], w["last_step"] + 1)]
    auto_s = math.fsum(oracle[seqs[i]][0] for i in steps)
    auto_j = math.fsum(oracle[seqs[i]][1] for i in steps)
    ran_s = math.fsum(gpu.steps[i].model_time_s for i in steps)
    ran_j = math.fsum(gpu.steps[i].model_energy_j for i in steps)
    oracle_j = math.fsum(oracle[seqs[i]][1] * (1 - oracle[seqs[i]][2] / 100) for i in steps)
    oracle_s = math.fsum(oracle[seqs[i]][0] * (1 + oracle[seqs[i]][3] / 100) for i in steps)
    return {"truth_steps": len(steps), "true_saved_pct": 100 * (1 - ran_j / auto_j),
            "true_slowdown_pct": 100 * (ran_s / auto_s - 1), "oracle_saved_pct": 100 * (1 - oracle_j / auto_j),
            "oracle_slowdown_pct": 100 * (oracle_s / auto_s - 1)}


@dataclass(frozen=True)
class PlannedOnce(VaryingSteps):
    """The run's varying steps with the book planned once for every seed (planning does not depend on it)."""

    book: ShapeBook | None = None

    def plan(self, problem: Problem, planner: Planner) -> ShapeBook:
        assert self.book is not None
        return self.book


def dry_run(seed: int, steps: int, known: StepModel, book: ShapeBook, reference: Problem) -> dict[str, Any]:
    """One seeded dry run (see the module docstring): the adjusted estimate and the pairs' mean at truth 0."""
    seqs = step_seqs(steps + 1, seed, median_len=256)
    clock = VirtualClock()
    gpu = FakeGpu(reference.costs, reference.profile, reference.latency_s, reference.stall_s, clock,
                  latency_std_s=reference.profile.switching.latency_std_s, duration_noise=DURATION_NOISE, seed=seed,
                  drift=DriftModel(seed=seed))
    timeline = FakeStepTimeline(gpu, clock)
    for seq in set(seqs[:steps]) - set(_COSTS):
        _COSTS[seq] = Problem.build(_TRUTH[seq], reference.profile, BUDGET).costs
    for i, seq in enumerate(seqs):
        timeline.shapes[i] = shape(seq)
        if i < steps:
            gpu.step_costs[i] = _COSTS[seq]
    varying = PlannedOnce([shape(s) for s in CONTROLLER_SHAPES], lambda wanted: None, timeline.shape_of,
                          kernel_time_s=known.kernel_time_s, book=book)
    with tempfile.TemporaryDirectory() as folder:
        trace_path, plan_path = Path(folder, "step.trace.json"), Path(folder, "plan.json")
        save_trace(reference.trace, trace_path)
        plan_path.write_text(json.dumps(schedule_json(reference, make_planner("latency-optimal").plan(reference))))
        controller = Controller(str(plan_path), str(trace_path), device=gpu, timeline=timeline, clock=clock,
                                varying=varying, budget=BUDGET, energy_read_every_s=0.0, ab_seed=seed, dry_run=True)
        with controller:
            for _ in range(steps):
                controller.step()
                controller.flush()
    summary = controller.summary
    assert summary is not None
    return {"seed": seed, "steps": summary.steps, "adjusted": summary.measured.to_json(),
            "paired_saving_ci95_pct": paired_interval(controller.windows), "auto_reasons": summary.auto_reasons}


def paired_interval(windows: list[dict[str, Any]]) -> list[float] | None:
    """The pairs' mean saving and its 95% interval over the run's A/B pairs (the estimate before adjustment)."""
    by_pair: dict[int, dict[str, dict[str, Any]]] = {}
    for window in windows:
        if window["pair"] is not None and window["as_intended"] and window["energy_j_per_step"] is not None:
            by_pair.setdefault(window["pair"], {})[window["arm"]] = window
    paired = Paired()
    for arms in by_pair.values():
        if len(arms) == 2:
            paired.add(100 * (1 - arms["B"]["energy_j_per_step"] / arms["A"]["energy_j_per_step"]))
    interval = paired.interval()
    return None if interval is None else [interval.lo_pct, interval.hi_pct]


def dry_runs(seeds: int, steps: int, jobs: int, first_seed: int = 0) -> dict[str, Any]:
    """``--dry-runs``: the coverage of both estimates at truth 0 over ``seeds`` runs (seeds from ``first_seed``
    on: other seeds than the reported ones to choose a method on)."""
    truth, known = models()
    seed_range = range(first_seed, first_seed + seeds)
    seqs = {seq for seed in seed_range for seq in step_seqs(steps + 1, seed, median_len=256)}
    _TRUTH.update({seq: truth.predict(shape(seq)) for seq in seqs})
    profile = load_profile("h200")
    reference = Problem.build(known.predict(shape(1024)), profile, BUDGET)
    book = ShapeBook.build([shape(s) for s in CONTROLLER_SHAPES],
                           lambda wanted: known.predict(wanted) if known.covers(wanted) else None, profile, BUDGET,
                           reference.latency_s, workers=jobs)
    book.close()
    runs = [dry_run(seed, steps, known, book, reference) for seed in seed_range]

    def coverage(intervals: list[list[float] | None]) -> dict[str, Any]:
        known_intervals = [i for i in intervals if i is not None]
        widths = sorted((hi - lo) / 2 for lo, hi in known_intervals)
        return {"runs": len(known_intervals), "hold_zero": sum(lo <= 0.0 <= hi for lo, hi in known_intervals),
                "median_half_width_pct": widths[len(widths) // 2] if widths else None,
                "max_half_width_pct": widths[-1] if widths else None}

    first = f" --first-seed {first_seed}" if first_seed else ""
    return {"provenance": provenance(f"python -m benchmarks.fake_gpu.varying --dry-runs {seeds} --steps {steps} "
                                     f"--jobs {jobs}{first}"),
            "runs": runs,
            "summary": {"adjusted_saving": coverage([r["adjusted"]["energy_saved_ci95_pct"] for r in runs]),
                        "adjusted_slowdown": coverage([r["adjusted"]["slowdown_ci95_pct"] for r in runs]),
                        "paired_saving": coverage([r["paired_saving_ci95_pct"] for r in runs])}}


def dry_markdown(result: dict[str, Any]) -> str:
    lines = ["# The A/B estimate of steps that vary at truth 0: dry runs on the fake H200", "",
             *provenance_lines(result["provenance"]), "",
             "| estimate | runs with an interval | holding 0 | median half-width (points) | widest |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, c in result["summary"].items():
        lines.append(f"| {name.replace('_', ' ')} | {c['runs']} | {c['hold_zero']} | "
                     f"{c['median_half_width_pct']:.2f} | {c['max_half_width_pct']:.2f} |")
    lines += ["", "Adjusted: the controller's estimate for steps that vary (every window regressed on its arm, "
              "expected kernel time, new inputs and time; HC3 standard error, Student-t on n - p); paired: the "
              "pairs' mean it replaced. Target: 95% nominal coverage, half-width <= 2 points."]
    return "\n".join(lines) + "\n"


def markdown(result: dict[str, Any]) -> str:
    lines = ["# Steps that vary on the fake H200: every step planned by its shape", "",
             *provenance_lines(result["provenance"]), "",
             "| seed | steps | planned | controlled | measured slowdown % [95% CI] | measured saving % | "
             "true saving % | oracle saving % | true / oracle | true slowdown % |",
             "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["runs"]:
        m = r["measured"]
        low, high = m["slowdown_ci95_pct"] or (math.nan, math.nan)
        lines.append(f"| {r['seed']} | {r['steps']} | {r['planned_steps']} | {r['controlled_steps']} | "
                     f"{m['slowdown_pct']:+.2f} [{low:+.2f}, {high:+.2f}] | {m['energy_saved_pct']:.2f} | "
                     f"{r['true_saved_pct']:.2f} | {r['oracle_saved_pct']:.2f} | "
                     f"{r['true_saved_pct'] / r['oracle_saved_pct']:.0%} | {r['true_slowdown_pct']:+.2f} |")
    s = result["summary"]
    lines += ["", f"Targets: measured slowdown within the {100 * BUDGET:g}% budget in {s['within_budget']} of "
              f"{len(result['runs'])} runs; true saving / oracle saving {s['true_over_oracle']:.0%} "
              "(target >= 80%)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--dry-runs", type=int, default=0, help="seeds of dry runs for the estimate's coverage")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the dry runs' first seed; other than 0, the results are printed, not written")
    args = parser.parse_args()
    if args.dry_runs:
        coverage = dry_runs(args.dry_runs, args.steps, args.jobs, args.first_seed)
        if not args.first_seed:
            write_results("varying_fake_gpu_dry", coverage, dry_markdown(coverage))
        print(dry_markdown(coverage))
        return
    truth, known = models()
    seqs = {seq for seed in range(args.seeds) for seq in step_seqs(args.steps + 1, seed)}
    oracle = oracles(truth, seqs, args.jobs)
    runs = [run(seed, args.steps, truth, known, oracle) for seed in range(args.seeds)]
    within = sum(r["measured"]["slowdown_pct"] is not None and r["measured"]["slowdown_pct"] <= 100 * BUDGET
                 for r in runs)
    ratio = float(np.mean([r["true_saved_pct"] / r["oracle_saved_pct"] for r in runs]))
    result = {"provenance": provenance(f"python -m benchmarks.fake_gpu.varying --steps {args.steps} --seeds "
                                       f"{args.seeds} --jobs {args.jobs}"),
              "runs": runs, "summary": {"within_budget": within, "true_over_oracle": ratio}}
    write_results("varying_fake_gpu", result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
