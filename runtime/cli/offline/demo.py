"""``kdvfs demo``: the main job on the bundled default data (grows with every capability)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kdvfs.agents.evaluation.ranges import row_ranges
from kdvfs.common.files import write_text_atomic
from kdvfs.common.run_record import write_run_record
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile
from kdvfs.envs.model.cost_tables import build_tables, step_breakdown
from kdvfs.envs.model.uncertainty import UncertaintySpec
from kdvfs.envs.trace.bundled import DEFAULT_TRACE, open_trace
from kdvfs.envs.trace.summary import summarize
from kdvfs.envs.trace.trace import Trace, with_measured_gaps
from kdvfs.runtime.cli.arguments import add_output, check_output_folder, sample_count
from kdvfs.runtime.cli.offline.plan import row_json
from kdvfs.runtime.cli.render import (
    basis_lines,
    breakdown_table,
    compare_table,
    console,
    err_console,
    profile_table,
    trace_tables,
)

if TYPE_CHECKING:
    from kdvfs.agents.common.problem import Problem
    from kdvfs.agents.evaluation.compare import Row

DEMO_BUDGETS = (0.0, 0.01, 0.03, 0.05, 0.1)
DEMO_SAMPLES = 8


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="run the main job on the bundled H200 data")
    parser.add_argument("--trace", default=DEFAULT_TRACE, help=f"trace to use (default {DEFAULT_TRACE})")
    parser.add_argument("--gpu", default="h200", help="GPU profile (default h200)")
    add_output(parser, "folder for the results (results.json), plot and run record (default runs/demo)", dest="out",
               default=Path("runs/demo"))
    parser.add_argument("--samples", type=sample_count, default=DEMO_SAMPLES,
                        help="sampled profiles in each figure's 90%% range, with the model's validated error "
                        f"(default {DEMO_SAMPLES}; 0: the validated error alone)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_output_folder(args.out)
    trace = with_measured_gaps(open_trace(args.trace))
    profile = load_profile(args.gpu)
    for table in trace_tables(summarize(trace)):
        console.print(table)
    console.print(profile_table(profile))
    tables = build_tables(trace, profile)
    auto = step_breakdown(trace, tables, tables.auto_time_s[:, 0], tables.auto_energy_j[:, 0],
                          tables.auto_gap_power_w[:, 0])
    console.print(breakdown_table({"trace": trace.meta.workload, "gpu": profile.name,
                                   "measured": dict(trace.meta.measurements), "predictions": [{"mode": "auto",
                                   "core_mhz": None, "mem_mhz": float(tables.memory_mhz[0]), **auto}]}))
    _compare(trace, profile, args.out, args.samples)
    return 0


def _compare(trace: Trace, profile: GpuProfile, out: Path, samples: int) -> None:
    """Every method and the shipped policy at a 1% budget with their 90% ranges, and the trade-off plot over
    DEMO_BUDGETS."""
    from kdvfs.agents.common.problem import Problem
    from kdvfs.agents.evaluation.compare import EVALUATED, compare, plot_tradeoff

    problem = Problem.build(trace, profile, 0.01)
    _stage(f"planning {len(EVALUATED)} methods at {len(DEMO_BUDGETS)} budgets")
    with err_console.status("planning") as status:
        rows = compare(problem, DEMO_BUDGETS, EVALUATED, lambda text: status.update(f"planning: {text}"))
        rows += _shipped_policy_rows(problem)
    _stage(f"ranges with {samples} sampled profiles")
    ranges = row_ranges(problem, rows, UncertaintySpec(samples) if samples else None)
    at_budget = [index for index, row in enumerate(rows) if row.budget == 0.01]
    console.print(compare_table([rows[i] for i in at_budget], problem, [ranges[i] for i in at_budget]))
    for line in basis_lines(*next((r.basis, r.samples) for r in ranges if r is not None)):
        console.print(line)
    plot, results = out / "pareto.png", out / "results.json"
    plot_tradeoff(rows, f"{trace.meta.workload} on {profile.name}, {problem.latency_s * 1e3:g} ms switching", plot)
    write_text_atomic(results, json.dumps([row_json(row, spread) for row, spread in zip(rows, ranges, strict=True)],
                                          indent=1) + "\n")
    record = write_run_record(out, {"trace": trace.meta.workload, "gpu": profile.name, "budgets": DEMO_BUDGETS,
                                    "latency_s": problem.latency_s, "methods": (*EVALUATED, "policy")})
    console.print(f"wrote {plot}, {results} (every method at every budget, as `kdvfs compare --json`) and {record}")


def _stage(text: str) -> None:
    """Progress on stderr where stdout is no terminal (where the tables go unseen until the end)."""
    if not sys.stdout.isatty():
        err_console.print(f"kdvfs demo: {text}", highlight=False)


def _shipped_policy_rows(problem: Problem) -> list[Row]:
    """The GPU's shipped policy at a 1% budget (none if it has no shipped policy)."""
    from kdvfs.agents.learned.policy.policy_planner import PolicyPlanner, policy_rows
    from kdvfs.common.paths import shipped_policy_path

    path = shipped_policy_path(problem.profile.name)
    if not path.is_file():
        console.print(f"no shipped policy for {problem.profile.name} ({path})")
        return []
    return policy_rows(problem, PolicyPlanner.from_file(path, problem.profile), [0.01])
