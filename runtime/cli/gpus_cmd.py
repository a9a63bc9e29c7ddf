"""``kdvfs gpus [list|show NAME]``: the GPU profiles kdvfs ships."""

from __future__ import annotations

import argparse

from envs.config import to_plain
from envs.profiles import available_profiles, load_profile
from runtime.cli.render import console, print_json, profile_table


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("gpus", help="list and show GPU profiles")
    parser.set_defaults(func=run_list)
    commands = parser.add_subparsers(dest="gpus_command", metavar="ACTION")

    listing = commands.add_parser("list", help="list the shipped GPU profiles (the default)")
    listing.set_defaults(func=run_list)

    show = commands.add_parser("show", help="show one GPU profile")
    show.add_argument("name", help="profile name (e.g. h200) or path to a profile .yaml")
    show.add_argument("--json", action="store_true", help="print JSON for scripts")
    show.set_defaults(func=run_show)


def run_list(args: argparse.Namespace) -> int:
    for name in available_profiles():
        profile = load_profile(name)
        console.print(f"{name:<12} {profile.model:<28} {len(profile.clock_pairs_mhz):>4} clock pairs  "
                      f"{profile.power.limit_w:>5.0f} W  switch {profile.switching.latency_mean_s * 1e3:g} ms")
    return 0


def run_show(args: argparse.Namespace) -> int:
    profile = load_profile(args.name)
    if args.json:
        print_json(to_plain(profile))
    else:
        console.print(profile_table(profile))
    return 0
