"""The power-limit method beside static, kdvfs's plans and the shipped policy on every H200 trace at 0.5/1/2%.

Every H200 trace: the bundled ones (``data/traces/h200/*.trace.json``) and the captured workloads
(``data/traces/h200/workloads/``). The power-limit method is what a user picks without kdvfs: the lowest board
power limit (whole watts) that keeps the budget, clocks left to the GPU. Every method is priced by the one cost
model, executed with the H200 switching latency, at the limit each trace was recorded under (the profile's
default where the trace has none).
Writes ``benchmarks/results/power_limit.json`` and ``.md``. From the repository root:

    python -m benchmarks.model.power_limit
"""

from __future__ import annotations

from typing import Any

from benchmarks.common.provenance import provenance, provenance_lines, write_results
from kdvfs.agents.common.problem import Problem, within_budget
from kdvfs.agents.evaluation.compare import Row, compare
from kdvfs.agents.learned.policy.policy_planner import PolicyPlanner, policy_rows
from kdvfs.agents.planners.power_limit import POWER_LIMIT
from kdvfs.common.paths import BUNDLED_TRACE_DIR, shipped_policy_path
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.bundled import bundled_traces, open_trace

GPU = "h200"
BUDGETS = (0.005, 0.01, 0.02)
METHODS = ("static", POWER_LIMIT, "per-phase", "latency-optimal")
KDVFS = ("latency-optimal", "policy")
"""kdvfs's own answers: the latency-aware plan and the shipped policy."""


def _figures(row: Row) -> dict[str, Any]:
    executed = row.executed
    return {"energy_saved_pct": executed.energy_saved_pct, "slowdown_pct": executed.slowdown_pct,
            "switches": executed.switches, "within_budget": within_budget(executed.slowdown_pct, row.budget),
            "power_limit_w": row.power_limit_w, "power_limit_source": row.power_limit_source}


def _ahead(methods: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Per kdvfs method, its saving minus the power-limit method's (points); None where it overruns the budget."""
    baseline = methods[POWER_LIMIT]["energy_saved_pct"]
    return {name: (methods[name]["energy_saved_pct"] - baseline if methods[name]["within_budget"] else None)
            for name in KDVFS if name in methods}


def h200_traces() -> dict[str, str]:
    """Label -> trace (bundled name or file) of every H200 trace: the bundled ones, then the captured workloads."""
    bundled = {name: name for name in bundled_traces() if name.startswith(f"{GPU}/")}
    workloads = sorted((BUNDLED_TRACE_DIR / GPU / "workloads").glob("*.trace.json*"))
    return {**bundled, **{f"{GPU}/workloads/{path.name.split('.')[0]}": str(path) for path in workloads}}


def trace_rows(trace: str, planner: PolicyPlanner) -> dict[str, Any]:
    """Every method and the policy on one trace at every budget."""
    problem = Problem.build(open_trace(trace), load_profile(GPU), BUDGETS[0])
    rows = compare(problem, BUDGETS, METHODS) + policy_rows(problem, planner, BUDGETS)
    budgets = {}
    for budget in BUDGETS:
        methods = {row.executed.method: _figures(row) for row in rows if row.budget == budget}
        budgets[f"{100 * budget:g}"] = {"methods": methods, "ahead_of_power_limit_pts": _ahead(methods)}
    return {"kernels": len(problem.trace), "auto_energy_j": problem.auto.energy_j,
            "auto_step_time_s": problem.auto.time_s, "power_limits": problem.power_limits.as_json(),
            "budgets": budgets}


def not_ahead(traces: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (trace, budget, kdvfs method) where kdvfs saves no more than the power-limit method or overruns."""
    found = []
    for name, trace in traces.items():
        for budget, entry in trace["budgets"].items():
            found += [{"trace": name, "budget_pct": float(budget), "method": method, "ahead_pts": lead}
                      for method, lead in entry["ahead_of_power_limit_pts"].items() if lead is None or lead <= 0]
    return found


def _cell(figures: dict[str, Any] | None) -> str:
    if figures is None:
        return "-"
    mark = "" if figures["within_budget"] else " !"
    return f"{figures['energy_saved_pct']:.2f}% / {figures['slowdown_pct']:.2f}%{mark}"


def _markdown(result: dict[str, Any]) -> str:
    lines = ["# The power-limit method beside kdvfs's plans (H200)", "", *provenance_lines(result["provenance"]), "",
             f"Energy saved / slowdown against auto, executed with {result['latency_ms']:g} ms switching; `!` over "
             "budget as executed. Power limit: the lowest whole-watt limit within the budget. Lead: kdvfs's saving "
             "minus the power-limit method's (points; `over` where kdvfs overruns the budget).", "",
             "| trace | budget | power limit | power-limit | static | per-phase | latency-optimal | policy | "
             "lead: latency-optimal | lead: policy |", "| --- " + "| ---: " * 9 + "|"]
    for name, trace in result["traces"].items():
        for budget, entry in trace["budgets"].items():
            methods, lead = entry["methods"], entry["ahead_of_power_limit_pts"]
            leads = [("over" if lead.get(m) is None else f"{lead[m]:+.2f}") for m in KDVFS]
            lines.append(f"| {name} | {budget}% | {methods[POWER_LIMIT]['power_limit_w']:g} W | "
                         + " | ".join(_cell(methods.get(m)) for m in (POWER_LIMIT, "static", "per-phase",
                                                                       "latency-optimal", "policy"))
                         + f" | {leads[0]} | {leads[1]} |")
    misses = result["not_ahead"]
    lines += ["", f"## Where kdvfs is not ahead of the power limit ({len(misses)} of "
              f"{len(result['traces']) * len(BUDGETS) * len(KDVFS)} cases)", ""]
    lines += [f"- {m['trace']} at {m['budget_pct']:g}%: {m['method']} "
              + ("overruns the budget" if m["ahead_pts"] is None else f"{m['ahead_pts']:+.2f} points")
              for m in misses] or ["- none"]
    return "\n".join(lines) + "\n"


def main() -> None:
    profile = load_profile(GPU)
    planner = PolicyPlanner.from_file(shipped_policy_path(GPU), profile)
    traces = {label: trace_rows(trace, planner) for label, trace in h200_traces().items()}
    result = {"provenance": provenance("python -m benchmarks.model.power_limit"), "gpu": GPU,
              "latency_ms": profile.switching.latency_mean_s * 1e3, "budgets_pct": [100 * b for b in BUDGETS],
              "traces": traces, "not_ahead": not_ahead(traces)}
    write_results("power_limit", result, _markdown(result))
    print(_markdown(result))


if __name__ == "__main__":
    main()
