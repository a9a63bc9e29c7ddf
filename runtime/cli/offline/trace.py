"""``kdvfs trace import|show|list``: bring profiler recordings into kdvfs and inspect traces."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from kdvfs.envs.gpu.profiles import load_profile, profile_path
from kdvfs.envs.synthetic.generator import generate_transformer_trace, load_workload
from kdvfs.envs.trace.bundled import bundled_traces, open_trace, trace_path
from kdvfs.envs.trace.format import save_trace
from kdvfs.envs.trace.importing import DEFAULT_FORMAT, import_trace, importer_formats
from kdvfs.envs.trace.ncu import enrich_with_ncu, read_ncu_csv
from kdvfs.envs.trace.summary import summarize
from kdvfs.runtime.cli.arguments import add_output, check_output_file, resolved
from kdvfs.runtime.cli.render import console, print_json, print_names, trace_tables


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("trace", help="import and inspect kernel traces")
    commands = parser.add_subparsers(dest="trace_command", required=True, metavar="ACTION")

    imp = commands.add_parser("import", help="import a profiler recording (default: a PyTorch profiler Kineto trace)")
    imp.add_argument("source", type=Path, help="the recording, e.g. a Kineto chrome trace .json or .json.gz")
    imp.add_argument("--format", default=DEFAULT_FORMAT, metavar="FORMAT",
                     help=f"recording format: {', '.join(importer_formats())} (default {DEFAULT_FORMAT})")
    add_output(imp, "kdvfs trace to write (.json or .json.gz)", required=True)
    imp.add_argument("--ncu", type=Path, help="Nsight Compute `--csv --page raw` export to take counters from")
    imp.add_argument("--step", type=int, default=-1, help="which complete step to keep (default -1: the last)")
    imp.add_argument("--workload", help="workload label (default: the file name)")
    imp.add_argument("--ref-mem-mhz", type=float, help="memory clock during the recording (MHz)")
    imp.add_argument("--observed-core-mhz", type=float, help="median SM clock during the recording (MHz)")
    imp.add_argument("--energy-j-per-step", type=float, help="measured energy of one step (J)")
    imp.add_argument("--step-time-s", type=float, help="measured wall time of one step (s)")
    imp.set_defaults(func=run_import)

    show = commands.add_parser("show", help="summarise a trace: counts, time by category and phase")
    show.add_argument("trace", help="trace file or bundled name (see `kdvfs trace list`)")
    show.add_argument("--json", action="store_true", help="print JSON for scripts")
    show.set_defaults(func=run_show)

    listing = commands.add_parser("list", help="list the bundled traces")
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing.set_defaults(func=run_list)

    generate = commands.add_parser("generate", help="generate a synthetic transformer training step")
    generate.add_argument("--workload", required=True,
                          help="preset name (configs/workloads/<name>.yaml, e.g. gpt2s) or a workload .yaml")
    generate.add_argument("--gpu", required=True, help="GPU profile name or .yaml (sets the roofline)")
    generate.add_argument("--seed", type=int, help="add seeded noise to kernel durations")
    add_output(generate, "kdvfs trace to write", required=True)
    generate.set_defaults(func=run_generate)


def run_import(args: argparse.Namespace) -> int:
    check_output_file(args.output, [args.source, args.ncu])
    measured = {key: value for key, value in (("energy_j_per_step", args.energy_j_per_step),
                                              ("step_time_s", args.step_time_s)) if value is not None}
    trace = import_trace(args.source, args.format, step=args.step, workload=args.workload, measurements=measured,
                         ref_mem_mhz=args.ref_mem_mhz, observed_core_mhz=args.observed_core_mhz)
    note = ""
    if args.ncu is not None:
        trace, matched = enrich_with_ncu(trace, read_ncu_csv(args.ncu), args.ncu.name)
        trace = replace(trace, meta=replace(trace.meta, source=f"{trace.meta.source}+ncu:{args.ncu.name}"))
        note = f", {matched} with ncu counters"
    save_trace(trace, args.output)
    console.print(f"wrote {args.output}: step {trace.meta.step_index}, {len(trace)} activities{note}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    summary = summarize(open_trace(args.trace))
    if args.json:
        print_json(summary)
    else:
        for table in trace_tables(summary):
            console.print(table)
    return 0


def run_list(args: argparse.Namespace) -> int:
    print_names(bundled_traces(), trace_path, args.json)
    return 0


def run_generate(args: argparse.Namespace) -> int:
    check_output_file(args.output, [args.workload, resolved(args.gpu, profile_path)])
    trace = generate_transformer_trace(load_workload(args.workload), load_profile(args.gpu), rng_seed=args.seed)
    save_trace(trace, args.output)
    console.print(f"wrote {args.output}: {len(trace)} activities, step {trace.step_time_s * 1e3:.2f} ms")
    return 0
