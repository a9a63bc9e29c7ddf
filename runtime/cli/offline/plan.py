"""``kdvfs plan`` and ``kdvfs compare``: schedule clocks for a step with any method, or all of them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kdvfs.agents.common.problem import Problem, outcome_of, rank_budget, rank_slack_s, within_budget
from kdvfs.agents.evaluation.compare import EVALUATED, Row, compare, plot_tradeoff
from kdvfs.agents.evaluation.ranges import ChangeRange, row_ranges, sampled_problems, schedule_range
from kdvfs.agents.planners.registry import PLANNERS, make_planner
from kdvfs.common.files import write_text_atomic
from kdvfs.common.units import checked_latency_s
from kdvfs.envs.gpu.profiles import load_profile, profile_path
from kdvfs.envs.model.schedule import Schedule
from kdvfs.envs.trace.bundled import open_trace, trace_path
from kdvfs.runtime.cli.arguments import (
    add_output,
    add_power_limit,
    budget,
    budget_list,
    check_output_file,
    latency_ms,
    resolved,
)
from kdvfs.runtime.cli.render import (
    add_range_arguments,
    basis_lines,
    compare_table,
    console,
    err_console,
    print_json,
    progress_bar,
    spec_from_args,
)

PLOT_BUDGETS = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1)


def add_problem_arguments(parser: argparse.ArgumentParser) -> None:
    """``--trace``, ``--gpu`` and ``--latency-ms``, read by :func:`problem_from_args`."""
    parser.add_argument("--trace", required=True, help="trace file or bundled name")
    parser.add_argument("--gpu", required=True, help="GPU profile name or .yaml")
    parser.add_argument("--latency-ms", type=latency_ms, help="switching latency to execute with, at most 10 s "
                        "(default: the profile's; 0 = ideal switching)")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    plan = subparsers.add_parser("plan", help="schedule clocks for a step with one method")
    add_problem_arguments(plan)
    plan.add_argument("--method", required=True, choices=sorted(PLANNERS), help="decision maker")
    plan.add_argument("--budget", "--slowdown", dest="budget", type=budget, required=True,
                      help="allowed step-time increase over auto (0.01 = 1%%; under torchrun the job's)")
    plan.add_argument("--no-slack", action="store_true", help="plan a torchrun rank's trace with the budget over "
                      "its own step, without its slack (the time it waits for the slowest rank)")
    add_output(plan, "write the schedule as JSON")
    plan.add_argument("--json", action="store_true", help="print the schedule and its summary as one JSON document "
                      "(the written file's keys plus output, energy_saved_pct, slowdown_pct, range, over_budget)")
    add_range_arguments(plan)
    plan.set_defaults(func=run_plan)

    comparison = subparsers.add_parser("compare", help="every method on a step, at one or more budgets")
    add_problem_arguments(comparison)
    comparison.add_argument("--budget", "--slowdown", dest="budget", type=budget_list, required=True,
                            help="budgets, e.g. 0.01 or 0,0.01,0.05")
    add_power_limit(comparison)
    comparison.add_argument("--json", action="store_true", help="print JSON for scripts")
    comparison.add_argument("--plot", type=Path, help=f"write the trade-off plot (budgets {100 * PLOT_BUDGETS[0]:g}%%-"
                            f"{100 * PLOT_BUDGETS[-1]:g}%%) to this PNG")
    add_range_arguments(comparison)
    comparison.set_defaults(func=run_compare)


def latency_from_args(args: argparse.Namespace) -> float | None:
    """``--latency-ms`` in seconds (None: the profile's)."""
    return None if args.latency_ms is None else checked_latency_s(args.latency_ms)


def problem_from_args(args: argparse.Namespace, budget: float, with_slack: bool = False,
                      power_limit_w: float | None = None) -> Problem:
    """The planning problem of :func:`add_problem_arguments`' arguments at ``budget`` (a fraction), priced at
    ``power_limit_w`` (W; None: the limit the trace was recorded under); ``with_slack``: the job's ``budget`` as
    the trace's rank's own budget with its slack (:func:`rank_budget`)."""
    trace = open_trace(args.trace)
    own = rank_budget(trace, budget) if with_slack else budget
    return Problem.build(trace, load_profile(args.gpu), own, latency_from_args(args), power_limit_w)


def ranges_of(problem: Problem, rows: list[Row], args: argparse.Namespace) -> list[ChangeRange | None]:
    """Each row's range (:func:`~kdvfs.agents.evaluation.ranges.row_ranges`) with the sample of
    :func:`add_range_arguments`' arguments, the latency varied unless ``--latency-ms`` fixes it; a progress bar
    once it runs 2 s."""
    with progress_bar("parameter samples") as progress:
        return row_ranges(problem, rows, spec_from_args(args, vary_latency=args.latency_ms is None), progress)


def schedule_json(problem: Problem, schedule: Schedule) -> dict[str, Any]:
    """A schedule as segments of consecutive kernels with their clocks, plus its predicted cost."""
    actions, costs = schedule.actions, problem.costs
    starts = [0] + [k for k in range(1, len(actions)) if actions[k] != actions[k - 1]]
    executed, planned, auto = outcome_of(problem, schedule), outcome_of(problem, schedule, ideal=True), problem.auto
    return {
        "format": "kdvfs-schedule", "version": 1, "method": schedule.method, "trace": problem.trace.meta.workload,
        "gpu": problem.profile.name, "budget": problem.budget, "latency_s": problem.latency_s,
        "kernels": costs.kernels, "solve_s": schedule.solve_s, "info": schedule.info,
        "segments": [{"start_kernel": k, "clocks": costs.label(int(actions[k]))} for k in starts],
        "auto": {"step_time_s": auto.time_s, "energy_j": auto.energy_j},
        "executed": {"step_time_s": executed.time_s, "energy_j": executed.energy_j, "switches": executed.switches},
        "planned": {"step_time_s": planned.time_s, "energy_j": planned.energy_j, "switches": planned.switches},
    }


def _over_budget(document: dict[str, Any]) -> str:
    """A note when the executed schedule overruns its budget (plans made without the switching latency)."""
    slowdown = document["executed"]["step_time_s"] / document["auto"]["step_time_s"] - 1
    if within_budget(100.0 * slowdown, document["budget"]):
        return ""
    planned = document["planned"]["step_time_s"] / document["auto"]["step_time_s"] - 1
    return (f"over budget: {slowdown:.2%} slowdown executed against a {document['budget']:.2%} budget "
            f"({planned:.2%} as planned, with instant switching); latency-optimal plans with the latency")


def problem_inputs(args: argparse.Namespace) -> list[Path | str | None]:
    """The files :func:`add_problem_arguments`' arguments read (bundled names as their files)."""
    return [resolved(args.trace, trace_path), resolved(args.gpu, profile_path)]


def run_plan(args: argparse.Namespace) -> int:
    check_output_file(args.output, problem_inputs(args))
    problem = problem_from_args(args, args.budget, with_slack=not args.no_slack)
    schedule = make_planner(args.method).plan(problem)
    slack_s = 0.0 if args.no_slack else rank_slack_s(problem.trace)
    document = {**schedule_json(problem, schedule), "job_budget": args.budget, "slack_s": slack_s}
    say = err_console.print if args.json else console.print
    if slack_s > 0:
        say(f"rank slack {slack_s * 1e3:.3g} ms per step (waiting for the slowest rank): planned with a "
            f"{problem.budget:.2%} budget over this rank's step for the job's {args.budget:.2%} "
            "(--no-slack: without it)")
    if args.output:
        write_text_atomic(args.output, json.dumps(document, indent=1) + "\n")
        say(f"wrote {args.output}")
    executed, auto = document["executed"], document["auto"]
    saved_pct = 100 * (1 - executed["energy_j"] / auto["energy_j"])
    slowdown_pct = 100 * (executed["step_time_s"] / auto["step_time_s"] - 1)
    note = _over_budget(document)
    spec = spec_from_args(args, vary_latency=args.latency_ms is None)
    with progress_bar("parameter samples") as progress:
        spread = schedule_range(problem, schedule, sampled_problems(problem, spec, progress),
                                0 if spec is None else spec.seed)
    if args.json:
        print_json({**document, "output": None if args.output is None else str(args.output),
                    "energy_saved_pct": saved_pct, "slowdown_pct": slowdown_pct, "range": spread.as_json(),
                    "over_budget": note or None})
        return 0
    low, high = spread.energy_saved_pct
    slow_low, slow_high = spread.slowdown_pct
    console.print(f"{args.method}: {len(document['segments'])} segments, energy saved {saved_pct / 100:.2%} "
                  f"[{low:.2f}, {high:.2f}], slowdown {slowdown_pct / 100:.2%} [{slow_low:.2f}, {slow_high:.2f}] "
                  f"(executed with {problem.latency_s * 1e3:g} ms switching), solved in {schedule.solve_s:.2f} s")
    for line in basis_lines(spread.basis, spread.samples) + ([note] if note else []):
        console.print(line)
    return 0


def row_json(row: Row, spread: ChangeRange | None) -> dict[str, Any]:
    """A row's JSON (the fields of ``Row.as_json``) and its ``range`` (null for a row without one)."""
    return {**row.as_json(), "range": None if spread is None else spread.as_json()}


def run_compare(args: argparse.Namespace) -> int:
    check_output_file(args.plot, problem_inputs(args))
    problem = problem_from_args(args, args.budget[0], power_limit_w=args.power_limit_w)
    with console.status("planning") as status:
        rows = compare(problem, args.budget, EVALUATED, lambda text: status.update(f"planning: {text}"))
        if args.plot:
            plotted = rows + compare(problem, [b for b in PLOT_BUDGETS if b not in args.budget], EVALUATED,
                                     lambda text: status.update(f"plot: {text}"))
            title = (f"{problem.trace.meta.workload} on {problem.profile.name}, "
                     f"{problem.latency_s * 1e3:g} ms switching")
            plot_tradeoff(plotted, title, args.plot)
    ranges = ranges_of(problem, rows, args)
    if args.json:
        print_json([row_json(row, spread) for row, spread in zip(rows, ranges, strict=True)])
    else:
        console.print(compare_table(rows, problem, ranges))
        for line in basis_lines(*next((r.basis, r.samples) for r in ranges if r is not None)):
            console.print(line)
    if args.plot and not args.json:
        console.print(f"wrote {args.plot}")
    return 0

