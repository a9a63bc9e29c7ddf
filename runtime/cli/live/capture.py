"""``kdvfs capture [--steps N] [--warmup W] -o trace.json -- python train.py ARGS``: record a training step."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kdvfs.common.errors import KdvfsError
from kdvfs.runtime.capture.capture_config import CaptureConfig
from kdvfs.runtime.capture.capture_errors import ScriptExitError
from kdvfs.runtime.capture.capture_launch import run_capture, split_command
from kdvfs.runtime.capture.recording import CaptureReport
from kdvfs.runtime.cli.arguments import add_output, check_output_file, command_paths
from kdvfs.runtime.cli.render import console, print_json

TIME_VARIES = 0.1
"""Step-time coefficient of variation above which a one-shape run gets a note."""
STDERR_FD = 2
"""With --json the script's own output goes to standard error, so standard output holds only the report."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "capture", help="record a training step of a PyTorch script into a trace, with its joules per step",
        usage="kdvfs capture [options] -o TRACE -- python train.py ARGS...")
    add_output(parser, "kdvfs trace to write (.json or .json.gz)", required=True)
    parser.add_argument("--steps", type=int, default=2, help="profiled steps; the trace keeps the last (default 2)")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured steps first (default 5)")
    parser.add_argument("--energy-window-s", type=float, default=5.0,
                        help="length of the unprofiled window that measures step time and energy (default 5 s; "
                             "the NVML energy counter updates ~10 times a second)")
    parser.add_argument("--shapes", type=int, default=None,
                        help="when steps vary in shape (dynamic padding, bucketing, an encoder-decoder's two lengths), "
                             "profile up to N shapes: the most frequent (written to -o) and the smallest and largest "
                             "in each varying length, each beside it as NAME.shape-K.trace.json (default: what the "
                             "step model needs for the run's shapes, its basis's columns + 3: 6 for one varying "
                             "length, 9 for two; fewer is an error that says how many; 1: one trace of the last "
                             "profiled step)")
    parser.add_argument("--max-profiled-steps", type=int, default=64,
                        help="most steps profiled while looking for those shapes (default 64)")
    parser.add_argument("--workload", help="label stored in the trace (default: the script's name)")
    parser.add_argument("--gpu-index", type=int, help="NVML index of the GPU the script uses (default: CUDA device "
                                                      "LOCAL_RANK, 0 outside torchrun, through CUDA_VISIBLE_DEVICES)")
    parser.add_argument("--no-energy", action="store_true", help="do not read NVML (no joules per step)")
    parser.add_argument("--ncu", action="store_true",
                        help="add Nsight Compute counters from a second run (ncu --clock-control none)")
    parser.add_argument("--keep-profile", type=Path, metavar="PATH",
                        help="also write the raw PyTorch profiler recording (chrome trace; .gz compresses)")
    parser.add_argument("--cpu-test-mode", action="store_true",
                        help="accept a CPU-only script; CPU ops stand in for kernels (tests and dry runs only)")
    parser.add_argument("--nvml-module", default="pynvml", help="NVML binding to import (default pynvml)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- python train.py ARGS...")
    parser.set_defaults(func=run)


def _script(command: list[str]) -> Path | None:
    """The user's script, or None for ``-m MODULE``."""
    target = split_command(command).target
    return None if target[0] == "-m" else Path(target[0])


def _workload(command: list[str]) -> str:
    target = split_command(command).target
    return target[1].rsplit(".", 1)[-1] if target[0] == "-m" else Path(target[0]).stem


def _print_report(report: CaptureReport) -> None:
    rank = f"rank {report.rank} of {report.world_size}: " if report.world_size > 1 else ""
    console.print(f"{rank}wrote {report.output}: {report.workload}, {report.activities} activities "
                  f"({report.kernels} kernels) on {report.gpu}")
    if report.world_size > 1 and report.job_step_time_s is not None:
        console.print(f"job step time {report.job_step_time_s * 1e3:.2f} ms (the slowest rank's), communication "
                      f"{report.communication_s * 1e3:.2f} ms per step on this rank")
    console.print(f"step time {report.step_time_s * 1e3:.2f} ms unprofiled, {report.profiled_step_time_s * 1e3:.2f} "
                  f"ms profiled: capture overhead {report.overhead:+.1%}")
    if report.energy_j_per_step is not None and report.avg_power_w is not None:
        console.print(f"energy {report.energy_j_per_step:.2f} J/step at {report.avg_power_w:.0f} W over "
                      f"{report.window_s:.1f} s ({report.window_steps} steps), SM clock {report.observed_core_mhz:.0f} "
                      f"MHz, memory {report.mem_mhz:.0f} MHz")
    if report.power_limit_w is not None:
        console.print(f"power limit {report.power_limit_w:.0f} W (enforced while recording; in the trace)")
    if report.kernels_with_counters:
        console.print(f"Nsight Compute counters on {report.kernels_with_counters} kernels")
    _print_shapes(report.shapes)


def _print_shapes(shapes: dict[str, Any]) -> None:
    """The step shapes the window saw and those captured (nothing for a run of one shape)."""
    seen = shapes.get("seen", [])
    cv = shapes.get("step_time_cv")
    if len(seen) == 1 and cv is not None and cv > TIME_VARIES:
        console.print(f"note: one input shape ({seen[0]['shape']}) but step times vary (cv {cv:.0%}): the trace is "
                      "one of these steps")
    if len(seen) < 2:
        return
    low, high = shapes["tokens_range"]
    console.print(f"steps vary: {len(seen)} shapes in {shapes['window_steps']} window steps, {low}-{high} tokens; "
                  f"captured {len(shapes['captured'])} in {shapes['profiled_steps']} profiled steps:")
    for entry in shapes["captured"]:
        time_s = entry["step_time_s"]
        timing = f"{time_s * 1e3:.2f} ms/step" if time_s is not None else "too few window steps to time"
        first = ", its profiled step the shape's first (one-time host set-up)" if entry.get("first_seen") else ""
        console.print(f"  {entry['shape']}: {entry['window_steps']} window steps, {timing}, {entry['kernels']} "
                      f"activities{first} -> {entry['output']}")
    errors = shapes.get("step_model") or []
    for error in errors:
        edge = " (edge)" if error["edge"] else ""
        console.print(f"  step model, {error['shape']} left out: kernel time {error['kernel_time_error_pct']:+.1f}%, "
                      f"step time {error['step_time_error_pct']:+.1f}%, kernel durations "
                      f"{error['weighted_duration_error_pct']:.1f}%{edge}, {error['basis_terms']} basis")
    for note in dict.fromkeys(e["basis_note"] for e in errors if e.get("basis_note")):
        console.print(f"  note: step model with one shape left out: {note}")
    for entry in shapes.get("missed", []):
        console.print(f"  note: {entry['shape']} ({entry['window_steps']} window steps) did not come up in the "
                      "profiled steps; raise --max-profiled-steps to capture it")


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    for output in (args.output, args.keep_profile):
        check_output_file(output, [_script(command), *command_paths(command)])
    if args.keep_profile is not None and args.keep_profile.absolute() == args.output.absolute():
        raise KdvfsError(f"--keep-profile {args.keep_profile} is the trace's own path; give it another")
    config = CaptureConfig(
        output=str(args.output), steps=args.steps, warmup=args.warmup, energy_window_s=args.energy_window_s,
        measure_energy=not args.no_energy, gpu_index=args.gpu_index, nvml_module=args.nvml_module,
        cpu_test_mode=args.cpu_test_mode, workload=args.workload or _workload(command),
        keep_profile=str(args.keep_profile) if args.keep_profile else None, shapes=args.shapes,
        max_profiled_steps=args.max_profiled_steps)
    try:
        reports = run_capture(command, config, ncu=args.ncu, script_stdout=STDERR_FD if args.json else None)
    except ScriptExitError as error:
        if args.json:  # stdout holds one JSON document in every outcome
            print_json({"error": str(error), "exit_code": error.exit_code})
        print(f"kdvfs: error: {error}", file=sys.stderr)
        return error.exit_code
    if args.json and len(reports) == 1:
        print_json(reports[0].as_json())
    elif args.json:
        print_json({"job_step_time_s": reports[0].job_step_time_s, "ranks": [r.as_json() for r in reports]})
    else:
        for report in reports:
            _print_report(report)
    return 0
