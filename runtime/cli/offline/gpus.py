"""``kdvfs gpus [list|show NAME|local]``: the GPU profiles kdvfs ships, and the GPUs of this machine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.table import Table

from kdvfs.common.config import to_plain
from kdvfs.envs.gpu.profiles import available_profiles, load_profile, profile_path
from kdvfs.runtime.cli.arguments import check_output_file
from kdvfs.runtime.cli.render import console, print_json, profile_table
from kdvfs.runtime.device.errors import DeviceIndexError
from kdvfs.runtime.device.nvml_device import LocalGpu, import_nvml, read_local_gpus
from kdvfs.runtime.device.profile_skeleton import skeleton_profile, write_skeleton_yaml


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("gpus", help="list and show GPU profiles")
    parser.add_argument("--json", action="store_true", help="print the list as JSON for scripts")
    parser.set_defaults(func=run_list)
    commands = parser.add_subparsers(dest="gpus_command", metavar="ACTION")

    listing = commands.add_parser("list", help="list the shipped GPU profiles (the default)")
    listing.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts")
    listing.set_defaults(func=run_list)

    show = commands.add_parser("show", help="show one GPU profile")
    show.add_argument("name", help="profile name (e.g. h200) or path to a profile .yaml")
    show.add_argument("--json", action="store_true", help="print JSON for scripts")
    show.set_defaults(func=run_show)

    local = commands.add_parser("local", help="read this machine's GPUs through NVML (read-only)")
    local.add_argument("--json", action="store_true", help="print JSON for scripts")
    local.add_argument("--write", type=Path, metavar="PATH", help="write a profile skeleton (.yaml) of GPU --index")
    local.add_argument("--name", help="profile name for --write (default: the file name without .yaml)")
    local.add_argument("--gpu-index", "--index", dest="index", type=int, default=0, metavar="I",
                       help="NVML index of the GPU --write describes (default 0)")
    local.add_argument("--nvml-module", default="pynvml", help="NVML binding to import (default pynvml)")
    local.set_defaults(func=run_local)


def run_list(args: argparse.Namespace) -> int:
    profiles = [load_profile(name) for name in available_profiles()]
    if args.json:
        print_json([{"name": p.name, "model": p.model, "clock_pairs": len(p.clock_pairs_mhz),
                     "power_limit_w": p.power.limit_w, "switching_latency_s": p.switching.latency_mean_s,
                     "path": str(profile_path(p.name))} for p in profiles])
        return 0
    for p in profiles:
        console.print(f"{p.name:<12} {p.model:<28} {len(p.clock_pairs_mhz):>4} clock pairs  "
                      f"{p.power.limit_w:>5.0f} W  switch {p.switching.latency_mean_s * 1e3:g} ms")
    return 0


def run_show(args: argparse.Namespace) -> int:
    profile = load_profile(args.name)
    if args.json:
        print_json(to_plain(profile))
    else:
        console.print(profile_table(profile))
    return 0


def _local_table(gpu: LocalGpu) -> Table:
    """One installed GPU as a two-column table."""
    table = Table(title=f"GPU {gpu.index}: {gpu.name} (driver {gpu.driver_version})", show_header=False)
    table.add_row("UUID", gpu.uuid)
    memory_mhz = ", ".join(map(str, gpu.memory_clocks_mhz))
    table.add_row("memory clocks", f"{memory_mhz} MHz (default {gpu.default_memory_mhz})")
    for mem in gpu.memory_clocks_mhz:
        cores = gpu.core_clocks_mhz[mem]
        table.add_row(f"core clocks @ mem {mem} MHz", f"{cores[0]}-{cores[-1]} MHz ({len(cores)} values)")
    low_w, high_w = gpu.power_limit_range_w
    table.add_row("power limit (range)", f"{gpu.power_limit_w:.0f} W ({low_w:.0f}-{high_w:.0f} W)")
    utilization = "unknown" if gpu.utilization_pct is None else f"{gpu.utilization_pct}%"
    table.add_row("power draw", f"{gpu.power_draw_w:.1f} W (utilisation {utilization})")
    table.add_row("SMs", "not reported by NVML" if gpu.sm_count is None else str(gpu.sm_count))
    table.add_row("memory", f"{gpu.memory_total_bytes / 2**30:.1f} GiB")
    return table


def run_local(args: argparse.Namespace) -> int:
    check_output_file(args.write)
    default = args.nvml_module == "pynvml"  # read_local_gpus' own binding
    gpus = read_local_gpus() if default else read_local_gpus(import_nvml(args.nvml_module))
    if args.write is not None and not 0 <= args.index < len(gpus):
        raise DeviceIndexError(f"GPU index {args.index} is out of range: this machine has {len(gpus)} GPU(s); "
                               "pick one listed by `kdvfs gpus local`")
    if args.json:
        print_json([to_plain(gpu) for gpu in gpus])
    else:
        for gpu in gpus:
            console.print(_local_table(gpu))
        if not gpus:
            console.print("NVML reports no GPUs on this machine")
    if args.write is not None:
        profile = write_skeleton_yaml(skeleton_profile(gpus[args.index], args.name or args.write.stem), args.write)
        print(f"kdvfs: wrote GPU profile {profile.name!r} of GPU {args.index} to {args.write}; check the values "
              "its sources list as copied", file=sys.stderr)
    return 0
