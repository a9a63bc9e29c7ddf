"""``kdvfs report RUN.jsonl [--plot out.png]``: a controlled run's A/B windows and its measured saving."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.table import Table

from kdvfs.common.errors import KdvfsError
from kdvfs.runtime.cli.arguments import check_output_file
from kdvfs.runtime.cli.live.run import measured_text, no_measurement_reason
from kdvfs.runtime.cli.render import console, err_console, predicted_text, print_json

if TYPE_CHECKING:  # the controller loads torch: not at startup
    from kdvfs.runtime.controller.model.json_form import JsonRecord
    from kdvfs.runtime.controller.model.run_summary import Measured, NetEffect, Predicted


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    report = subparsers.add_parser("report", help="a `kdvfs run --log` file: A/B windows, measured saving, plot")
    report.add_argument("log", type=Path, help="the JSONL log of `kdvfs run --log` (or Controller(log=...))")
    report.add_argument("--plot", type=Path, metavar="PNG", help="also plot the windows and the estimate")
    report.add_argument("--json", action="store_true", help="print JSON for scripts")
    report.set_defaults(func=report_command)


@dataclass(frozen=True)
class LoggedRun:
    """What ``kdvfs report`` reads of a run's log: the windows (with their joules), the live estimates, the
    summary's measured effects and prediction (None: the run wrote no summary), the last measured effect while
    controlling (None: none), and whether its last record was cut off (a killed run) and ignored."""

    windows: list[dict[str, Any]]
    estimates: list[dict[str, Any]]
    measured: Measured | None
    measured_net: NetEffect | None
    predicted: Predicted | None
    cut_off: bool


def read_run(path: Path) -> LoggedRun:
    """The run the log at ``path`` records (:class:`LoggedRun`).

    Raises:
        KdvfsError: the log has no A/B window, or a record lacks a key this kdvfs version writes.
    """
    from kdvfs.runtime.controller.event_log import read_event_log  # loads the controller (torch): not at startup
    from kdvfs.runtime.controller.model.json_form import JsonFormError
    from kdvfs.runtime.controller.model.run_summary import Measured, NetEffect

    records, cut_off = read_event_log(path)
    try:
        joules = {r["last_step"]: r["energy_j_per_step"] for r in records if r["event"] == "window_energy"}
        windows = [{**r, "energy_j_per_step": joules.get(r["last_step"])} for r in records if r["event"] == "window"]
        estimates = [r for r in records if r["event"] in ("pair", "pair_energy")]
        summary = next((r for r in reversed(records) if r["event"] == "summary"), None)
        if not windows:
            raise KdvfsError(f"{path}: no A/B windows in this log (a run too short, or not a kdvfs run log)")
        measured = summary["measured"] if summary else estimates[-1]["measured"] if estimates else None
        _arm_figures(windows)
        return LoggedRun(windows, estimates, None if measured is None else Measured.from_json(measured),
                         None if summary is None else NetEffect.from_json(summary["measured_net"]),
                         None if summary is None else _predicted(summary["predicted"]), cut_off)
    except (KeyError, TypeError, JsonFormError) as error:
        raise KdvfsError(f"{path}: a record lacks {error} (not a log of this kdvfs version); pass the file of "
                         "`kdvfs run --log`") from None


def _predicted(logged: dict[str, Any]) -> Predicted:
    """A summary's ``predicted`` (logs written before ranges existed have none)."""
    from kdvfs.runtime.controller.model.run_summary import Predicted

    return Predicted.from_json({"range": None, **logged})


def _arm_figures(windows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per arm (``auto``, ``controlled``), the windows run wholly in it: their count, mean seconds and joules per
    step (None without such windows, or without joules)."""
    figures = {}
    for arm, name in (("A", "auto"), ("B", "controlled")):
        chosen = [w for w in windows if w["arm"] == arm and w["controlled_steps"] == (w["steps"] if arm == "B" else 0)]
        joules = [w["energy_j_per_step"] for w in chosen if w["energy_j_per_step"] is not None]
        figures[name] = {"windows": len(chosen),
                         "step_time_s": float(np.mean([w["step_time_s"] for w in chosen])) if chosen else None,
                         "energy_j_per_step": float(np.mean(joules)) if joules else None}
    return figures


def _arm_rows(windows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [(f"{arm} ({letter})", str(row["windows"]),
             "-" if row["step_time_s"] is None else f"{row['step_time_s'] * 1e3:.2f}",
             "-" if row["energy_j_per_step"] is None else f"{row['energy_j_per_step']:.2f}")
            for (arm, row), letter in zip(_arm_figures(windows).items(), "AB", strict=True)]


def _no_measurement(run: LoggedRun) -> str | None:
    if run.measured is None:
        return f"no A/B pair completed in {len(run.windows)} windows: run longer"
    return no_measurement_reason(run.measured)


def report_json(run: LoggedRun, path: Path) -> dict[str, Any]:
    """``kdvfs report --json``: the log, the windows per arm, the measured effect while controlling and over the
    run, the cost model's prediction, why nothing was measured (or null) and whether the last record was cut
    off (docs/schemas/report.schema.json)."""
    def written(record: JsonRecord | None) -> dict[str, Any] | None:
        return None if record is None else record.to_json()

    return {"log": str(path), "arms": _arm_figures(run.windows), "measured": written(run.measured),
            "measured_net": written(run.measured_net), "predicted": written(run.predicted),
            "no_measurement_reason": _no_measurement(run), "last_record_cut_off": run.cut_off}


def report_table(run: LoggedRun) -> Table:
    """Windows per arm, the measured effect with its interval, and the cost model's prediction."""
    table = Table(title="kdvfs report: A/B windows")
    for column in ("", "windows", "ms per step", "J per step"):
        table.add_column(column)
    for row in _arm_rows(run.windows):
        table.add_row(*row)
    if run.measured is not None:
        table.add_row("measured saving / slowdown (95%)", measured_text(run.measured), "", "")
    reason = _no_measurement(run)
    if reason is not None:
        table.add_row("why no measurement", reason, "", "")
    if run.measured_net is not None:
        table.add_row("over the run", measured_text(run.measured_net), "", "")
    if run.predicted is not None:
        table.add_row("predicted (cost model)", predicted_text(run.predicted, "+"), "", "")
    return table


def plot_run(run: LoggedRun, path: Path) -> None:
    """Joules and seconds per step of each window over time, and the estimate with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    windows, t0_s = run.windows, run.windows[0]["start_s"]
    figure, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for arm, colour, label in (("A", "tab:grey", "auto (A)"), ("B", "tab:green", "controlled (B)")):
        chosen = [w for w in windows if w["arm"] == arm]
        times = [w["end_s"] - t0_s for w in chosen]
        axes[0].plot(times, [w["energy_j_per_step"] or np.nan for w in chosen], "o", ms=3, color=colour, label=label)
        axes[1].plot(times, [w["step_time_s"] * 1e3 for w in chosen], "o", ms=3, color=colour, label=label)
    axes[0].set_ylabel("J per step")
    axes[1].set_ylabel("ms per step")
    axes[0].legend()
    end_by_step = {w["last_step"]: w["end_s"] - t0_s for w in windows}
    for key, colour, label in (("energy_saved", "tab:green", "energy saved"), ("slowdown", "tab:red", "slowdown")):
        points = [(end_by_step.get(e["step"], np.nan), e["measured"][f"{key}_pct"], e["measured"][f"{key}_ci95_pct"])
                  for e in run.estimates if e["measured"][f"{key}_pct"] is not None]
        if points:
            times = [p[0] for p in points]
            axes[2].plot(times, [p[1] for p in points], color=colour, label=f"measured {label}")
            axes[2].fill_between(times, [p[2][0] for p in points], [p[2][1] for p in points], color=colour,
                                 alpha=0.2)
        if run.predicted is not None:
            predicted_pct = run.predicted.energy_saved_pct if key == "energy_saved" else run.predicted.slowdown_pct
            axes[2].axhline(predicted_pct, color=colour, ls="--", label=f"predicted {label}")
    axes[2].axhline(0, color="black", lw=0.5)
    axes[2].set_ylabel("% (95% interval)")
    axes[2].set_xlabel("s since the first window")
    axes[2].legend(fontsize="small")
    figure.suptitle("kdvfs run: A/B windows and the measured effect")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def report_command(args: argparse.Namespace) -> int:
    check_output_file(args.plot, [args.log])
    run = read_run(args.log)
    if run.cut_off:
        print(f"kdvfs report: {args.log}: last record cut off, ignored (the run was killed while writing it)",
              file=sys.stderr)
    if args.json:
        print_json(report_json(run, args.log))
    else:
        console.print(report_table(run))
    if args.plot:
        plot_run(run, args.plot)
        (err_console if args.json else console).print(f"plot: {args.plot}")
    return 0
