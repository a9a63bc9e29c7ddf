"""``kdvfs run --policy P --trace T [--dry-run] [--budget 0.01] -- python train.py ARGS`` and ``kdvfs reset``."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.model.ranges import COVERAGE
from kdvfs.runtime.cli.arguments import (
    budget,
    check_output_file,
    check_output_folder,
    command_paths,
    latency_ms,
    resolved,
)
from kdvfs.runtime.cli.live.daemon import add_daemon_option
from kdvfs.runtime.cli.render import console, predicted_text, print_json
from kdvfs.runtime.daemon.client import DaemonDevice, daemon_socket
from kdvfs.runtime.device.errors import ClockRestoreError, DeviceIndexError
from kdvfs.runtime.device.lease import reset_leased_gpu_clocks
from kdvfs.runtime.device.nvml_device import (
    gpu_count,
    import_nvml,
    require_clock_permission,
    reset_fix,
    restore_error,
)

if TYPE_CHECKING:  # the controller loads torch: not at startup
    from kdvfs.runtime.controller.model.run_summary import EndedRank, JobSummary, Measured, NetEffect, RankRow

STDERR_FD = 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser(
        "run", help="train with the clock controller applying a plan or frozen policy (--dry-run: change nothing)",
        usage="kdvfs run --policy P --trace T [options] -- python train.py ARGS...")
    run.add_argument("--policy", required=True, help="plan from `kdvfs plan -o`, frozen policy (.kdvfs-policy.npz) or "
                     "shipped policy name (`kdvfs policy list`, e.g. h200)")
    run.add_argument("--trace", required=True, help="the expected step: trace file (`kdvfs capture`) or bundled name")
    run.add_argument("--gpu", help="GPU profile (default: the plan's, or the shipped one listing the GPU's NVML name)")
    run.add_argument("--dry-run", action="store_true", help="change no clock; log what would be requested and when")
    run.add_argument("--budget", "--slowdown", dest="budget", type=budget, default=0.01,
                     help="allowed step-time increase over auto (default 0.01 = 1%%)")
    run.add_argument("--gpu-index", type=int, help="NVML index of the GPU the script uses (default: CUDA device "
                                                   "LOCAL_RANK, 0 outside torchrun, through CUDA_VISIBLE_DEVICES)")
    run.add_argument("--latency-ms", type=latency_ms, help="switching latency to request ahead by, at most 10 s "
                     "(default: the profile's)")
    run.add_argument("--log", type=Path, help="JSONL log of every request, step and energy window")
    run.add_argument("--tensorboard", type=Path, metavar="DIR", help="write TensorBoard scalars to DIR")
    run.add_argument("--ab-share", type=float, default=0.25,
                     help="share of windows run at auto to measure the saving against, in [0, 0.9] (default 0.25; "
                          "0: no measurement)")
    run.add_argument("--ab-window-s", type=float, default=0.5, help="shortest A/B window in seconds (default 0.5)")
    run.add_argument("--replay", action="store_true", help="with a frozen policy: replay its noise-free rollout as a "
                     "fixed schedule instead of deciding online inside every step")
    run.add_argument("--no-energy", action="store_true", help="do not read the GPU's energy counter: time-only A/B "
                     "(no joules; for GPUs without a counter)")
    run.add_argument("--cpu-test-mode", action="store_true", help="accept a CPU-only script (tests and dry runs)")
    run.add_argument("--in-process", action="store_true", help="run the controller in the training process (default: "
                     "in a process of its own, off the training process's interpreter lock; under torchrun one a rank)")
    run.add_argument("--nvml-module", default="pynvml", help="NVML binding to import (default pynvml)")
    add_daemon_option(run, "lock clocks")
    run.add_argument("--json", action="store_true", help="print the summary as JSON (script output to stderr)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- python train.py ARGS...")
    run.set_defaults(func=run_command, json_error={"gpu_restored": True})  # a refused run changed no clock

    reset = subparsers.add_parser("reset", help="return a GPU's SM and memory clocks to its own control (root, or "
                                                  "through kdvfs daemon)")
    reset.add_argument("--gpu-index", type=int, default=0, help="NVML index of the GPU (default 0)")
    reset.add_argument("--nvml-module", default="pynvml", help="NVML binding to import (default pynvml)")
    reset.add_argument("--force", action="store_true",
                       help="reset even a GPU leased by a running kdvfs process (its clocks change under it)")
    add_daemon_option(reset, "reset the clocks")
    reset.set_defaults(func=reset_command)


def _figure(value: Any, scale: float = 1.0, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}{unit}"


def _interval(value: float | None, bounds: list[float] | None) -> str:
    return "-" if value is None or bounds is None else f"{value:+.2f}% [{bounds[0]:+.2f}, {bounds[1]:+.2f}]"


def measured_text(measured: Measured | NetEffect) -> str:
    """A measured effect as ``saving [lo, hi] / slowdown [lo, hi]``."""
    return (f"{_interval(measured.energy_saved_pct, measured.energy_saved_ci95_pct)} / "
            f"{_interval(measured.slowdown_pct, measured.slowdown_ci95_pct)}")


def no_measurement_reason(measured: Measured) -> str | None:
    """Why a run measured no effect (its figures read ``-``), or None when it did."""
    if measured.slowdown_pct is not None:
        return None
    from kdvfs.runtime.controller.measurement.estimator import MIN_PAIRS

    return (f"no A/B pair completed ({measured.windows_auto} auto and {measured.windows_controlled} "
            f"controlled windows as intended; an interval needs {MIN_PAIRS} pairs, {2 * MIN_PAIRS} windows of at "
            "least --ab-window-s each): run longer, or with --ab-share above 0")


def summary_table(job: JobSummary) -> Table:
    """The controller's summary at exit."""
    summary = job.summary
    mode = "dry run (no clock changed)" if summary.dry_run else "clocks controlled"
    if summary.observe_only:
        mode = "observe-only (the GPU refused clock setting: clocks at auto)"
    elif summary.error and not summary.dry_run:
        mode = "clocks controlled until an error, then auto"
    table = Table(title=f"kdvfs run: {summary.source} on {summary.gpu}, {mode}", show_header=False)
    caveat = summary.not_measured_on_a_gpu
    noise = " (not a GPU's: means nothing)" if caveat else ""
    rows = [
        *([("! not a GPU measurement", caveat)] if caveat else []),
        ("clock control (nvml: this process; daemon:SOCKET)", summary.clock_control),
        ("steps / controlled / mismatches", f"{summary.steps} / {summary.controlled_steps} / {summary.mismatches}"),
        ("clock requests" + (" (would have made)" if summary.dry_run else ""), str(summary.switches)),
        ("step time (ms, GPU)", _figure(summary.step_time_s, 1e3)),
        ("energy per step (J, NVML)", _figure(summary.energy_j_per_step)),
        ("energy per step auto / controlled (J)", f"{_figure(summary.energy_j_per_step_auto)} / "
                                                  f"{_figure(summary.energy_j_per_step_controlled)}"),
        ("measured saving / slowdown while controlling (95% interval)", measured_text(summary.measured) + noise),
        ("measured saving / slowdown over the run", measured_text(summary.measured_net) + noise),
        (f"predicted saving / slowdown (cost model, {COVERAGE:.0%} range)", predicted_text(summary.predicted)),
    ]
    reason = no_measurement_reason(summary.measured)
    if reason is not None:
        rows.append(("why no measured saving / slowdown", reason))
    if summary.backed_off:
        rows.append(("backed off", summary.backoff_reason))
    if summary.guard_off:
        rows.append(("guard off", summary.guard_off))
    if summary.observe_only:
        rows.append(("observe-only", summary.observe_only))
    elif summary.error:
        rows.append(("controller error (GPU returned to auto)", summary.error))
    rows += _rank_rows(job.ranks) if len(job.ranks) > 1 else []
    for label, value in rows:
        table.add_row(label, value)
    return table


def _rank_rows(ranks: list[RankRow | EndedRank]) -> list[tuple[str, str]]:
    """Each rank's row of a job's summary table."""
    from kdvfs.runtime.controller.model.run_summary import EndedRank

    rows = []
    for rank in ranks:
        if isinstance(rank, EndedRank):
            rows.append((f"rank {rank.rank}: ended without a summary, restored", str(rank.gpu_restored)))
        else:
            rows.append((f"rank {rank.rank} (GPU {rank.gpu_index}): steps / controlled, J per step, restored",
                         f"{rank.steps} / {rank.controlled_steps}, {_figure(rank.energy_j_per_step)}, "
                         f"{rank.gpu_restored}"))
    return rows


def run_command(args: argparse.Namespace) -> int:
    from kdvfs.agents.learned.policy.shipped import policy_source_path
    from kdvfs.envs.gpu.profiles import profile_path
    from kdvfs.envs.trace.bundled import trace_path
    from kdvfs.runtime.controller.config import ControllerConfig
    from kdvfs.runtime.controller.model.run_summary import EndedSummary
    from kdvfs.runtime.controller.training.launch import run_controlled

    inputs = [resolved(args.policy, policy_source_path), resolved(args.trace, trace_path),
              resolved(args.gpu, profile_path)]
    check_output_file(args.log, [*inputs, *command_paths(args.command)])
    check_output_folder(args.tensorboard)
    config = ControllerConfig.from_options(
        args.policy, args.trace, gpu=args.gpu, budget=args.budget, dry_run=args.dry_run,
        gpu_index=args.gpu_index, nvml_module=args.nvml_module, daemon=daemon_socket(args.daemon),
        latency_ms=args.latency_ms,
        log=str(args.log) if args.log else None, tensorboard=str(args.tensorboard) if args.tensorboard else None,
        cpu_test_mode=args.cpu_test_mode, measure_energy=not args.no_energy, ab_share=args.ab_share,
        window_s=args.ab_window_s, online=not args.replay, own_process=not args.in_process)
    code, summary = run_controlled(args.command, config, script_stdout=STDERR_FD if args.json else None)
    if args.json:
        print_json(summary.to_json())
    elif isinstance(summary, EndedSummary):  # no process wrote its summary
        console.print(f"kdvfs run: {summary.error}; GPU back at its own clock control: {summary.gpu_restored}"
                      f"; {summary.windows} A/B windows logged")
    else:
        console.print(summary_table(summary))
    if code != 0:
        print(f"kdvfs: {script_end(code)}", file=sys.stderr)
    return code


def script_end(code: int) -> str:
    """How the script ended, from ``kdvfs run``'s exit code (128 + N: killed by signal N)."""
    if code > 128:
        with contextlib.suppress(ValueError):
            return f"the script was killed by {signal.Signals(code - 128).name} (exit code {code})"
    return f"the script exited with code {code}"


def reset_command(args: argparse.Namespace) -> int:
    nvml = import_nvml(args.nvml_module)
    count = gpu_count(nvml)
    if not 0 <= args.gpu_index < count:
        indices = f"its GPU indices are 0-{count - 1}" if count else "NVML reports no GPU"
        raise DeviceIndexError(f"there is no GPU {args.gpu_index} on this machine: {indices} (`kdvfs gpus local` "
                               "lists them); nothing was reset")
    socket_path = daemon_socket(args.daemon)
    if socket_path is not None:
        return _reset_through_daemon(args, socket_path, nvml)
    require_clock_permission(needs="resetting GPU clocks", fix=f"run `sudo kdvfs reset --gpu-index {args.gpu_index}`")
    try:
        name = reset_leased_gpu_clocks(args.gpu_index, nvml, force=args.force)
    except ClockRestoreError as error:
        raise restore_error(error.where, args.gpu_index, error.failures, reset_fix(args.gpu_index)) from None
    console.print(f"GPU {args.gpu_index} ({name}): SM and memory clocks returned to the GPU's own control")
    return 0


def _reset_through_daemon(args: argparse.Namespace, socket_path: str, nvml: types.ModuleType) -> int:
    """``kdvfs reset`` through the daemon: lease the GPU (refused while another client holds it: the daemon
    resets that GPU when its holder's connection ends), reset, end the connection."""
    if args.force:
        raise KdvfsError("--force does not apply through the kdvfs daemon: it resets a GPU the moment its holder's "
                         "connection ends; stop the holder, or run `sudo kdvfs reset --force` without --daemon")
    with DaemonDevice(socket_path, args.gpu_index, nvml, check_energy=False) as device:
        device.reset_clocks()
        name = device.name
    console.print(f"GPU {args.gpu_index} ({name}): SM and memory clocks returned to the GPU's own control "
                  f"(through the kdvfs daemon at {socket_path})")
    return 0
