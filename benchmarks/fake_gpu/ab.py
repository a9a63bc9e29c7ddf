"""The A/B measurement and its guard against a known truth: the fake GPU with the H200's drift and noise.

    python -m benchmarks.fake_gpu.ab [--seeds 50]   # writes benchmarks/results/ab_fake_gpu.{json,md}

Per seed, on the small GPT-3 XL step (``h200/gpt3xl-1layer-b4``) with the default controller settings
(windows of 10 steps and 0.5 s, ``ab_share`` 0.25, guard margin 0.5%) and
:class:`kdvfs.envs.model.drift.DriftModel` (seeded: +2.1% energy and time over 120 s, adjacent 10-step
windows differing by 0.4% / 0.2%):

1. **coverage**: the latency-optimal plan at a 1% budget, controlled for 120 simulated s. The truth is
   the fake's own: the counted steps' cost-model time and energy with the drift and noise undone
   (:func:`kdvfs.runtime.testing.ab_truth.true_effect`). Does each 95% interval hold it; half-widths.
2. **dry run**: the same plan with ``dry_run``, 120 s: does the guard ever back off.
3. **overrun**: the plan at a 3% budget under a guard whose budget is 2 points below the plan's true
   slowdown: is it caught within 60 simulated s, and when.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.provenance import RESULTS, provenance, provenance_lines, write_results
from kdvfs.agents.common.problem import Problem
from kdvfs.agents.planners.registry import make_planner
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.drift import DriftModel
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.runtime.cli.offline.plan import schedule_json
from kdvfs.runtime.controller import Controller
from kdvfs.runtime.controller.model.run_summary import RunSummary
from kdvfs.runtime.testing.ab_truth import true_effect
from kdvfs.runtime.testing.fake_gpu import FakeGpu, FakeStepTimeline, VirtualClock

TRACE = "h200/gpt3xl-1layer-b4"
RUN_S, CATCH_S = 120.0, 60.0


def write_plan(folder: Path, budget: float) -> tuple[Path, Problem]:
    problem = Problem.build(open_trace(TRACE), load_profile("h200"), budget)
    path = folder / f"plan-{budget}.json"
    path.write_text(json.dumps(schedule_json(problem, make_planner("latency-optimal").plan(problem))))
    return path, problem


def run(plan: Path, problem: Problem, seed: int, seconds: float, log: Path, **options: Any
        ) -> tuple[RunSummary, FakeGpu, list[dict[str, Any]]]:
    """One controlled run on a drifting fake GPU; its summary, the GPU and the log's records."""
    clock = VirtualClock()
    gpu = FakeGpu(problem.costs, problem.profile, problem.latency_s, problem.stall_s, clock,
                  drift=DriftModel(seed=seed))
    controller = Controller(str(plan), TRACE, device=gpu, timeline=FakeStepTimeline(gpu, clock), clock=clock,
                            energy_read_every_s=0.0, ab_seed=seed, log=str(log), **options)
    with controller:
        while clock.now_s() < seconds:
            for _ in range(20):
                controller.step()
            controller.flush()
    assert controller.summary is not None
    return controller.summary, gpu, [json.loads(line) for line in log.read_text().splitlines()]


def coverage(plan: Path, problem: Problem, seed: int, folder: Path) -> dict[str, Any]:
    summary, gpu, records = run(plan, problem, seed, RUN_S, folder / f"cover-{seed}.jsonl", budget=0.01)
    truth = true_effect(gpu, [r for r in records if r["event"] == "window"])
    assert truth is not None
    measured = summary.measured
    (e_lo, e_hi), (t_lo, t_hi) = measured.energy_saved_ci95_pct, measured.slowdown_ci95_pct
    return {"seed": seed, "true_saved_pct": truth.energy_saved_pct, "true_slowdown_pct": truth.slowdown_pct,
            "measured": measured.to_json(), "saved_covered": bool(e_lo <= truth.energy_saved_pct <= e_hi),
            "slowdown_covered": bool(t_lo <= truth.slowdown_pct <= t_hi), "saved_half_width_pct": (e_hi - e_lo) / 2,
            "slowdown_half_width_pct": (t_hi - t_lo) / 2, "backed_off": summary.backed_off}


def dry(plan: Path, problem: Problem, seed: int, folder: Path) -> dict[str, Any]:
    summary, _, _ = run(plan, problem, seed, RUN_S, folder / f"dry-{seed}.jsonl", budget=0.01, dry_run=True)
    lo, hi = summary.measured.slowdown_ci95_pct
    return {"seed": seed, "backed_off": summary.backed_off, "slowdown_ci95_pct": [lo, hi],
            "contains_0": bool(lo <= 0 <= hi)}


def overrun(plan: Path, problem: Problem, seed: int, folder: Path, guard_budget: float) -> dict[str, Any]:
    _, gpu, records = run(plan, problem, seed, CATCH_S, folder / f"over-{seed}.jsonl", budget=guard_budget)
    backoffs = [r for r in records if r["event"] == "backoff"]
    caught_s = gpu.steps[backoffs[0]["step"]].end_s if backoffs else None
    truth = true_effect(gpu, [r for r in records if r["event"] == "window"])
    return {"seed": seed, "caught_s": caught_s, "caught": bool(caught_s is not None and caught_s <= CATCH_S),
            "true_slowdown_pct": None if truth is None else truth.slowdown_pct}


def _figures(results: dict[str, list[dict[str, Any]]], guard_budget: float) -> dict[str, Any]:
    cover, dry_runs, over = results["coverage"], results["dry"], results["overrun"]
    caught = [r["caught_s"] for r in over if r["caught"]]
    return {
        "seeds": len(cover),
        "saved_coverage": float(np.mean([r["saved_covered"] for r in cover])),
        "slowdown_coverage": float(np.mean([r["slowdown_covered"] for r in cover])),
        "saved_half_width_pct": {"median": float(np.median([r["saved_half_width_pct"] for r in cover])),
                                 "max": float(np.max([r["saved_half_width_pct"] for r in cover]))},
        "slowdown_half_width_pct": {"median": float(np.median([r["slowdown_half_width_pct"] for r in cover])),
                                    "max": float(np.max([r["slowdown_half_width_pct"] for r in cover]))},
        "true_saved_pct_mean": float(np.mean([r["true_saved_pct"] for r in cover])),
        "true_slowdown_pct_mean": float(np.mean([r["true_slowdown_pct"] for r in cover])),
        "coverage_runs_backed_off": sum(r["backed_off"] for r in cover),
        "dry_backoffs": sum(r["backed_off"] for r in dry_runs),
        "dry_contains_0": float(np.mean([r["contains_0"] for r in dry_runs])),
        "overrun_guard_budget_pct": guard_budget * 100,
        "overrun_true_slowdown_pct_mean": float(np.mean([r["true_slowdown_pct"] for r in over
                                                         if r["true_slowdown_pct"] is not None])),
        "overrun_caught": float(np.mean([r["caught"] for r in over])),
        "overrun_caught_s": {"median": float(np.median(caught)) if caught else None,
                             "max": float(np.max(caught)) if caught else None},
    }


def _markdown(document: dict[str, Any]) -> str:
    f = document["figures"]

    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    return "\n".join([
        "# A/B measurement on the drifting fake GPU", "", *provenance_lines(document["provenance"]), "",
        f"{f['seeds']} seeds, `{TRACE}` on the H200 profile, default controller settings (windows of 10 steps "
        "and 0.5 s, `ab_share` 0.25, guard margin 0.5%), drift model defaults (+2.1% energy and time over "
        "120 s, adjacent 10-step windows differing by 0.4% / 0.2% sd).", "",
        "| target | result | verdict |", "| --- | --- | --- |",
        f"| 95% interval covers the true saving in >= 90% of runs (120 s) | {f['saved_coverage']:.0%} | "
        f"{met(f['saved_coverage'] >= 0.9)} |",
        f"| 95% interval covers the true slowdown in >= 90% of runs | {f['slowdown_coverage']:.0%} | "
        f"{met(f['slowdown_coverage'] >= 0.9)} |",
        f"| half-width <= 0.5% after 2 min (saving: median / max) | {f['saved_half_width_pct']['median']:.3f}% / "
        f"{f['saved_half_width_pct']['max']:.3f}% | {met(f['saved_half_width_pct']['max'] <= 0.5)} |",
        f"| half-width <= 0.5% after 2 min (slowdown: median / max) | "
        f"{f['slowdown_half_width_pct']['median']:.3f}% / {f['slowdown_half_width_pct']['max']:.3f}% | "
        f"{met(f['slowdown_half_width_pct']['max'] <= 0.5)} |",
        f"| dry runs with drift: the guard never backs off | {f['dry_backoffs']} back-offs in {f['seeds']} runs "
        f"(interval holds 0 in {f['dry_contains_0']:.0%}) | {met(f['dry_backoffs'] == 0)} |",
        f"| overrun by 2 points caught within 60 s in >= 95% of seeds | {f['overrun_caught']:.0%} (median "
        f"{f['overrun_caught_s']['median']:.1f} s, latest {f['overrun_caught_s']['max']:.1f} s) | "
        f"{met(f['overrun_caught'] >= 0.95)} |", "",
        f"Truth (mean over seeds): {f['true_saved_pct_mean']:.2f}% energy saved at {f['true_slowdown_pct_mean']:.2f}% "
        f"slowdown for the 1% plan (cost model with the drift undone); the overrun plan truly slows by "
        f"{f['overrun_true_slowdown_pct_mean']:.2f}% against a guard budget of {f['overrun_guard_budget_pct']:.2f}%. "
        f"Coverage runs that backed off: {f['coverage_runs_backed_off']}.", ""])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {"coverage": [], "dry": [], "overrun": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        plan, problem = write_plan(folder, 0.01)
        over_plan, over_problem = write_plan(folder, 0.03)
        probe = overrun(over_plan, over_problem, 10_000, folder, 1.0)
        guard_budget = (probe["true_slowdown_pct"] - 2.0) / 100
        for seed in range(args.seeds):
            results["coverage"].append(coverage(plan, problem, seed, folder))
            results["dry"].append(dry(plan, problem, seed, folder))
            results["overrun"].append(overrun(over_plan, over_problem, seed, folder, guard_budget))
            print(f"seed {seed}: {results['coverage'][-1]['saved_covered']} {results['overrun'][-1]['caught_s']}",
                  file=sys.stderr)
    document = {"provenance": provenance("python -m benchmarks.fake_gpu.ab " + " ".join(argv)),
                "figures": _figures(results, guard_budget), "runs": results}
    write_results("ab_fake_gpu", document, _markdown(document), folder=RESULTS)
    print(_markdown(document))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
