"""``kdvfs demo``: the main job on the bundled default data (grows with every capability)."""

from __future__ import annotations

import argparse

from envs.bundled import DEFAULT_TRACE, open_trace
from envs.profiles import load_profile
from envs.summary import summarize
from runtime.cli.render import console, profile_table, trace_tables


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="run the main job on the bundled H200 data")
    parser.add_argument("--trace", default=DEFAULT_TRACE, help=f"trace to use (default {DEFAULT_TRACE})")
    parser.add_argument("--gpu", default="h200", help="GPU profile (default h200)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    trace = open_trace(args.trace)
    profile = load_profile(args.gpu)
    for table in trace_tables(summarize(trace)):
        console.print(table)
    console.print(profile_table(profile))
    return 0
