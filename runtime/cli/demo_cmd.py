"""``kdvfs demo``: the main job on the bundled default data (grows with every capability)."""

from __future__ import annotations

import argparse

from envs.bundled import DEFAULT_TRACE, open_trace
from envs.cost_tables import build_tables, step_breakdown
from envs.profiles import load_profile
from envs.summary import summarize
from envs.trace import with_measured_gaps
from runtime.cli.render import breakdown_table, console, profile_table, trace_tables


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="run the main job on the bundled H200 data")
    parser.add_argument("--trace", default=DEFAULT_TRACE, help=f"trace to use (default {DEFAULT_TRACE})")
    parser.add_argument("--gpu", default="h200", help="GPU profile (default h200)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
    return 0
