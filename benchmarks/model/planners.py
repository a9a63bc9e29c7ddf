"""Planner benchmarks: the paper check on the RTX 3080 Ti, every method on the H200 GPT-3-XL step, speed.

Writes ``benchmarks/results/planners.json``, ``.md`` and ``pareto_h200_gpt3xl.png``. From the repository root:

    python -m benchmarks.model.planners
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from benchmarks.common.provenance import RESULTS, provenance, provenance_lines, write_results
from kdvfs.agents.common.problem import Problem, score
from kdvfs.agents.evaluation.compare import compare, plot_tradeoff
from kdvfs.agents.planners.registry import COMPARED, make_planner
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile
from kdvfs.envs.synthetic.generator import generate_transformer_trace, load_workload
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.trace import Trace

PAPER = {"ilp_global_0pct": 15.64, "ilp_global_1pct": 17.0, "pass_level_0pct": 2.07}
PLOT_BUDGETS = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1)


def paper_figures(trace: Trace, profile: GpuProfile) -> dict[str, float]:
    """The paper's three figures for a step, ideal switching: ILP global at 0% and 1%, pass-level at 0%."""
    problem = Problem.build(trace, profile, 0.0, latency_s=0.0)
    one = problem.with_budget(0.01)
    return {"ilp_global_0pct": score(problem, make_planner("ilp").plan(problem)).energy_saved_pct,
            "ilp_global_1pct": score(one, make_planner("ilp").plan(one)).energy_saved_pct,
            "pass_level_0pct": score(problem, make_planner("per-phase").plan(problem)).energy_saved_pct}


def paper_check() -> dict[str, Any]:
    """GPT-3-XL single layer (seq 1024, batch 40), generated, on the RTX 3080 Ti profile, ideal switching."""
    profile = load_profile("rtx3080ti")
    config = replace(load_workload("gpt3xl"), name="gpt3xl-1layer-s1024-b40", layers=1, seq=1024, batch=40)
    trace = generate_transformer_trace(config, profile)
    return {"ours_pct": paper_figures(trace, profile), "paper_pct": PAPER, "kernels": len(trace)}


def h200_methods() -> dict[str, Any]:
    """Every method on the bundled H200 GPT-3-XL step at a 1% budget with the H200 switching latency."""
    problem = Problem.build(open_trace("h200/gpt3xl-24layer-b4"), load_profile("h200"), 0.01)
    rows = compare(problem, [0.01], COMPARED)
    methods = {row.executed.method: {"executed": row.executed.as_json(), "as_planned": row.planned.as_json()}
               for row in rows}
    oracle = make_planner("latency-optimal").plan(problem)
    plotted = rows + compare(problem, [b for b in PLOT_BUDGETS if b != 0.01], COMPARED)
    plot_tradeoff(plotted, "gpt3xl-24layer-b4 on h200, 6 ms switching", RESULTS / "pareto_h200_gpt3xl.png")
    return {"latency_ms": problem.latency_s * 1e3, "methods": methods,
            "latency_optimal_certified_gap_j": oracle.info["gap_j"], "auto_energy_j": problem.auto.energy_j,
            "tradeoff": [{"budget_pct": 100 * r.budget, **r.executed.as_json()} for r in plotted]}


def _markdown(result: dict[str, Any]) -> str:
    lines = ["# Planner benchmarks", "", *provenance_lines(result["provenance"])]
    paper = result["paper_check"]
    lines += ["", "## Paper check: GPT-3-XL layer (seq 1024, batch 40, generated) on `rtx3080ti`, ideal switching",
              "", f"{paper['kernels']} kernels per step.", "", "| figure | kdvfs | arXiv 2601.08539 |",
              "| --- | ---: | ---: |"]
    for key, label in (("ilp_global_0pct", "ILP global, 0% budget"), ("ilp_global_1pct", "ILP global, 1% budget"),
                       ("pass_level_0pct", "pass-level, 0% budget")):
        lines.append(f"| {label} | {paper['ours_pct'][key]:.2f}% | {paper['paper_pct'][key]:.2f}% |")
    h200 = result["h200"]
    lines += ["", f"## H200 GPT-3-XL 24 layers, 1% budget, {h200['latency_ms']:g} ms switching", "",
              "| method | energy saved | slowdown | switches/step | solve (s) | as planned: saved / slowdown |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for method, r in h200["methods"].items():
        e, p = r["executed"], r["as_planned"]
        lines.append(f"| {method} | {e['energy_saved_pct']:.2f}% | {e['slowdown_pct']:.2f}% | {e['switches']} | "
                     f"{e['solve_s']:.2f} | {p['energy_saved_pct']:.2f}% / {p['slowdown_pct']:.2f}% |")
    lines += ["", f"Latency-optimal certified gap: {h200['latency_optimal_certified_gap_j']:.4f} J of "
              f"{h200['auto_energy_j']:.2f} J (auto). Trade-off plot: `pareto_h200_gpt3xl.png`."]
    return "\n".join(lines) + "\n"


def main() -> None:
    result = {"provenance": provenance("python -m benchmarks.model.planners"), "paper_check": paper_check(),
              "h200": h200_methods()}
    write_results("planners", result, _markdown(result))
    print(_markdown(result))


if __name__ == "__main__":
    main()
