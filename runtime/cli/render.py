"""Terminal rendering shared by the CLI commands: JSON output and rich tables."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.model_error import RangeBasis
from kdvfs.envs.model.ranges import COVERAGE
from kdvfs.envs.model.uncertainty import DEFAULT_SAMPLES, METHOD, UncertaintySpec
from kdvfs.runtime.cli.arguments import sample_count

if TYPE_CHECKING:
    from kdvfs.agents.common.problem import Problem
    from kdvfs.agents.evaluation.compare import Row
    from kdvfs.agents.evaluation.ranges import ChangeRange
    from kdvfs.agents.learned.noisy_evaluation import NoisyRow
    from kdvfs.runtime.controller.model.run_summary import Predicted

console = Console(width=None if sys.stdout.isatty() else 120, soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)
"""Messages beside a ``--json`` document, which owns stdout."""
PROGRESS_AFTER_S = 2.0


def print_json(document: Any) -> None:
    """Print machine-readable output (stable key order, no colour)."""
    print(json.dumps(document, indent=2))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def add_range_arguments(parser: argparse.ArgumentParser, seed: bool = True) -> None:
    """``--samples`` and (with ``seed``) ``--seed``: the sampled profiles of every figure's range (shared by
    ``predict``, ``plan``, ``compare`` and ``evaluate``, whose own ``--seed`` seeds the sample too)."""
    parser.add_argument("--samples", type=sample_count, default=DEFAULT_SAMPLES,
                        help=f"profiles drawn over the GPU profile's parameter ranges ({METHOD}) for each figure's "
                        f"{100 * COVERAGE:.0f}%% range, with the model's validated error (default {DEFAULT_SAMPLES}; "
                        "0: the validated error alone)")
    parser.add_argument("--uncertainty", action="store_true",
                        help="accepted for scripts written when ranges were optional; every figure has its range now")
    if seed:
        parser.add_argument("--seed", type=int, default=0, help="seed of the sampled profiles (default 0)")


def spec_from_args(args: argparse.Namespace, vary_latency: bool = True) -> UncertaintySpec | None:
    """The sample of :func:`add_range_arguments`' arguments; None for ``--samples 0``."""
    return UncertaintySpec(args.samples, args.seed, vary_latency) if args.samples > 0 else None


def basis_lines(basis: RangeBasis, samples: int) -> list[str]:
    """What the ranges shown rest on, in one line, and the profile's note (no data of its own) when it has one."""
    level, clocks = basis.level, basis.clocks
    lines = [f"ranges ({COVERAGE:.0%}): the model's error on {level.count('energy_j')} measurements ({level.key}) "
             f"and, where clocks move, on {clocks.count('energy_j')} ({clocks.key})"
             + (f", and {samples} sampled profiles" if samples else "") + " (docs/guide/reading-results.md)"]
    return lines + ([f"note: {basis.note}"] if basis.note else [])


@contextmanager
def progress_bar(label: str) -> Iterator[Callable[[int, int], None]]:
    """A ``(done, total)`` callback that shows a progress bar on stderr once the work has run 2 s."""
    started = time.monotonic()
    bar = Progress(console=Console(stderr=True), transient=True)
    task: list[Any] = []

    def update(done: int, total: int) -> None:
        if not task and time.monotonic() - started > PROGRESS_AFTER_S:
            bar.start()
            task.append(bar.add_task(label, total=total))
        if task:
            bar.update(task[0], completed=done)

    try:
        yield update
    finally:
        bar.stop()


def with_range(text: str, bounds: Sequence[float] | None, fmt: str) -> str:
    """``"2.18%"`` with its range: ``"2.18% [1.30, 2.90]"``."""
    if bounds is None:
        return text
    return f"{text} [{bounds[0]:{fmt}}, {bounds[1]:{fmt}}]"


def predicted_text(predicted: Predicted, sign: str = "") -> str:
    """A run summary's ``predicted`` saving and slowdown with their ranges where it has them (logs written
    before ranges existed have none): ``"2.07% [0.61, 3.48] / 0.89% [0.20, 1.96]"``."""
    spread = predicted.range or {}
    return " / ".join(with_range(f"{value:{sign}.2f}%", spread.get(key), f"{sign}.2f") for key, value in
                      (("energy_saved_pct", predicted.energy_saved_pct), ("slowdown_pct", predicted.slowdown_pct)))


def trace_tables(summary: dict[str, Any]) -> list[Table]:
    """The summary of ``kdvfs.envs.trace.summary.summarize`` as three tables: overview, by category, by phase."""
    overview = Table(title=f"Trace {summary['workload']} ({summary['gpu']})", show_header=False)
    overview.add_row("source", summary["source"])
    overview.add_row("kernels / memsets / memcpys per step",
                     f"{summary['kernels_per_step']} / {summary['memsets_per_step']} / {summary['memcpys_per_step']}")
    overview.add_row("step time (ms)", _ms(summary["step_time_s"]))
    overview.add_row("kernel time / idle (ms)", f"{_ms(summary['busy_s'])} / {_ms(summary['idle_s'])}")
    overview.add_row("median kernel (us)", f"{summary['median_kernel_s'] * 1e6:.1f}")
    overview.add_row("kernels with counters", str(summary["kernels_with_features"]))
    for key, value in summary["measurements"].items():
        overview.add_row(f"measured {key}", f"{value:.4g}")
    tables = [overview]
    for title, key in (("Time by category", "by_category"), ("Time by phase", "by_phase")):
        table = Table(title=title)
        for column in (title.split()[-1], "kernels", "time (ms)", "share"):
            table.add_column(column, justify="left" if column == title.split()[-1] else "right")
        for name, row in summary[key].items():
            table.add_row(name, str(row["kernels"]), _ms(row["time_s"]), f"{row['share']:.1%}")
        tables.append(table)
    return tables


def profile_table(profile: GpuProfile) -> Table:
    """One GPU profile as a two-column table."""
    table = Table(title=f"GPU profile {profile.name} ({profile.model})", show_header=False)
    clocks = profile.clocks
    for mem in clocks.memory_mhz:
        cores = clocks.core_mhz[mem]
        table.add_row(f"core clocks @ mem {mem} MHz", f"{cores[0]}-{cores[-1]} MHz ({len(cores)} values)")
    table.add_row("clock pairs", str(len(profile.clock_pairs_mhz)))
    table.add_row("power limit (range)", f"{profile.power.limit_w:.0f} W ({profile.power.limit_range_w[0]:.0f}-"
                  f"{profile.power.limit_range_w[1]:.0f} W)")
    table.add_row("idle power", f"{profile.power.idle_w:.1f} W")
    peaks = ", ".join(f"{k} {v / 1e12:.1f}" for k, v in profile.roofline.peak_flops.items())
    table.add_row("peak TFLOP/s", peaks)
    table.add_row("DRAM bandwidth", f"{profile.roofline.dram_bandwidth_bytes_per_s / 1e12:.2f} TB/s")
    table.add_row("SMs", str(profile.roofline.sm_count))
    switching = profile.switching
    table.add_row("switching latency", f"{switching.latency_mean_s * 1e3:.3f} ± {switching.latency_std_s * 1e3:.3f} ms"
                  f"{' (estimate)' if switching.estimated else ''}")
    statuses = [p.status for p in profile.cost_model.values()]
    summary = ", ".join(f"{statuses.count(s)} {s}" for s in ("calibrated", "estimate", "placeholder") if s in statuses)
    table.add_row("cost model", f"{len(statuses)} parameters: {summary}" if statuses else "not calibrated yet")
    return table


def breakdown_table(result: dict[str, Any], caption: str | None = None) -> Table:
    """``kdvfs predict`` output: one column per mode, step totals then energy by category; ``caption`` under it."""
    predictions = result["predictions"]
    table = Table(title=f"Predicted step of {result['trace']} on {result['gpu']}", caption=caption)
    table.add_column("")
    for row in predictions:
        label = "auto" if row["mode"] == "auto" else f"{row['core_mhz']:g}:{row['mem_mhz']:g} MHz"
        table.add_column(label, justify="right")
    if result["measured"]:
        table.add_column("measured", justify="right")
    measured = result["measured"]
    lines = [("step time (ms)", "step_time_s", 1e3, measured.get("step_time_s")),
             ("energy (J)", "energy_j", 1.0, measured.get("energy_j_per_step")),
             ("average power (W)", "avg_power_w", 1.0, None)]
    for label, key, scale, observed in lines:
        cells = [with_range(f"{row[key] * scale:.2f}", _scaled(row.get("range", {}).get(key), scale), ".2f")
                 for row in predictions]
        if measured:
            cells.append("" if observed is None else f"{observed * scale:.2f}")
        table.add_row(label, *cells)
    for category in predictions[0]["by_category"]:
        cells = [f"{row['by_category'][category]['energy_j']:.2f}" for row in predictions]
        table.add_row(f"  {category} energy (J)", *cells, *([""] if measured else []))
    return table


def _scaled(bounds: Sequence[float] | None, scale: float) -> list[float] | None:
    return None if bounds is None else [value * scale for value in bounds]


def compare_table(rows: Sequence[Row], problem: Problem, ranges: Sequence[ChangeRange | None] | None = None
                  ) -> Table:
    """``kdvfs compare`` output: one row per method and budget, executed with the problem's latency; with
    ``ranges`` (one per row), each figure's range in brackets."""
    from kdvfs.agents.common.problem import within_budget  # the compare command has it loaded already
    from kdvfs.agents.evaluation.compare import SEARCHED

    over = {id(row) for row in rows if not within_budget(row.executed.slowdown_pct, row.budget)}
    notes = (["! over budget as executed (planned without the switching latency)"] if over else [])
    table = Table(title=f"{problem.trace.meta.workload} on {problem.profile.name}, "
                        f"{problem.latency_s * 1e3:g} ms switching latency, {problem.power_limits.describe()}",
                  caption=" ".join(notes) or None)
    for column in ("budget", "method", "energy saved", "slowdown", "switches", "solve (s)", "as planned"):
        table.add_column(column, justify="left" if column == "method" else "right", no_wrap=True)
    for index, row in enumerate(rows):
        e, p = row.executed, row.planned
        spread = None if ranges is None else ranges[index]
        saved, slowdown = (None, None) if spread is None else (spread.energy_saved_pct, spread.slowdown_pct)
        method = e.method if row.power_limit_source != SEARCHED else f"{e.method} ({row.power_limit_w:g} W)"
        table.add_row(f"{row.budget:.1%}", method, with_range(f"{e.energy_saved_pct:.2f}%", saved, ".2f"),
                      with_range(f"{e.slowdown_pct:.2f}%", slowdown, ".2f") + (" !" if id(row) in over else ""),
                      str(e.switches), f"{e.solve_s:.2f}", f"{p.energy_saved_pct:.2f}% / {p.slowdown_pct:.2f}%")
    return table


def noisy_table(rows: Sequence[NoisyRow], problem: Problem) -> Table:
    """``kdvfs evaluate --episodes`` output: per method and budget, means over the disturbed episodes."""
    episodes = rows[0].episodes if rows else 0
    table = Table(title=f"{problem.trace.meta.workload} on {problem.profile.name}, {problem.latency_s * 1e3:g} ms "
                        f"switching latency, {episodes} disturbed episodes (means)")
    for column in ("budget", "method", "energy saved", "slowdown", "within budget", "switches/step", "solve (s)"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for row in rows:
        method = row.method if row.planned_budget is None else f"{row.method} (planned {row.planned_budget:.2%})"
        table.add_row(f"{row.budget:.1%}", method, f"{row.energy_saved_pct:.2f}%", f"{row.slowdown_pct:.2f}%",
                      f"{row.within_budget:.0%}", f"{row.switches:.1f}", f"{row.solve_s:.2f}")
    return table


def print_names(names: list[str], path_of: Callable[[str], Path], as_json: bool) -> None:
    """A listing of shipped items: one name a line, or (``as_json``) ``[{"name", "path"}]``."""
    if as_json:
        print_json([{"name": name, "path": str(path_of(name))} for name in names])
    else:
        for name in names:
            console.print(name)
