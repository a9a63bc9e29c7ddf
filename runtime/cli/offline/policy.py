"""``kdvfs policy list``: the frozen policies kdvfs ships, by the short names ``kdvfs run --policy`` takes."""

from __future__ import annotations

import argparse

from kdvfs.agents.learned.policy.shipped import policy_source_path, shipped_policies
from kdvfs.runtime.cli.render import print_names


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("policy", help="list the shipped frozen policies")
    commands = parser.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    listing = commands.add_parser("list", help="list the shipped policies (`kdvfs run --policy NAME`)")
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing.set_defaults(func=run_list)


def run_list(args: argparse.Namespace) -> int:
    print_names(shipped_policies(), policy_source_path, args.json)
    return 0
