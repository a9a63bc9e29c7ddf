"""``kdvfs predict``: step time, energy and power of a trace on a GPU, in auto mode and at given clocks, under
the power limit the trace was recorded under or another one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile
from kdvfs.envs.model.cost_model import ClockLimits, CostParams, idle_power_w
from kdvfs.envs.model.cost_tables import build_tables, step_breakdown
from kdvfs.envs.model.model_error import RangeBasis, range_basis
from kdvfs.envs.model.power_limits import power_limits
from kdvfs.envs.model.ranges import level_range, log_deviations, moved_range, range_json
from kdvfs.envs.model.uncertainty import UncertaintySpec, over_samples
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.trace import Trace, with_measured_gaps
from kdvfs.envs.trace.trace_set import load_trace_set, main_path, window_prediction
from kdvfs.runtime.cli.arguments import add_power_limit
from kdvfs.runtime.cli.render import (
    add_range_arguments,
    basis_lines,
    breakdown_table,
    console,
    print_json,
    progress_bar,
    spec_from_args,
)

RANGED = ("step_time_s", "energy_j", "avg_power_w")


def _pair(text: str) -> tuple[float, float]:
    try:
        core, mem = (float(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not CORE_MHZ:MEM_MHZ (e.g. 1410:3201)") from None
    return core, mem


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("predict", help="predict step time, energy and power of a trace")
    parser.add_argument("--trace", required=True, help="trace file or bundled name")
    parser.add_argument("--gpu", required=True, help="GPU profile name or .yaml")
    parser.add_argument("--pair", type=_pair, action="append", default=[], metavar="CORE_MHZ:MEM_MHZ",
                        help="also predict at this locked clock pair (repeatable)")
    add_power_limit(parser)
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    add_range_arguments(parser)
    parser.set_defaults(func=run)


def _measured_elsewhere(trace: Trace, profile: GpuProfile) -> str:
    """A warning when the trace's measured joules and seconds come from another GPU than the profile's."""
    if not trace.meta.measurements or trace.meta.gpu.strip().lower() == profile.model.strip().lower():
        return ""
    return (f"note: the measured values were recorded on {trace.meta.gpu}, not on {profile.model} "
            f"(profile {profile.name!r}): they are no check of this prediction")


def predictions(trace: Trace, profile: GpuProfile, pairs: list[tuple[float, float]],
                power_limit_w: float | None = None) -> list[dict[str, Any]]:
    """The auto-mode row, then one row per locked pair: step totals and the split by category, priced at
    ``power_limit_w`` (W; None: the limit the trace was recorded under)."""
    tables = build_tables(trace, profile, power_limit_w=power_limit_w)
    rows: list[dict[str, Any]] = [{"mode": "auto", "core_mhz": None, "mem_mhz": float(tables.memory_mhz[0]),
                                   **step_breakdown(trace, tables, tables.auto_time_s[:, 0],
                                                    tables.auto_energy_j[:, 0], tables.auto_gap_power_w[:, 0])}]
    for core, mem in pairs:
        match = np.flatnonzero((tables.pairs_mhz[:, 0] == core) & (tables.pairs_mhz[:, 1] == mem))
        if not len(match):
            raise KdvfsError(f"clock pair {core:g}:{mem:g} MHz is not supported by GPU profile {profile.name!r}; "
                             f"see `kdvfs gpus show {profile.name}`")
        index = int(match[0])
        rows.append({"mode": "locked", "core_mhz": core, "mem_mhz": mem,
                     **step_breakdown(trace, tables, tables.time_s[:, index], tables.energy_j[:, index],
                                      float(tables.gap_power_w[index]))})
    return rows


def with_ranges(rows: list[dict[str, Any]], trace: Trace, profile: GpuProfile, pairs: list[tuple[float, float]],
                spec: UncertaintySpec | None, power_limit_w: float | None = None) -> RangeBasis:
    """Add to each row ``range``: the 90% range of each step total (:mod:`kdvfs.envs.model.ranges`). Auto at the
    recorded limit rests on the level evidence alone; every other row also on the clocks evidence and on its
    spread over ``spec``'s sampled profiles (None: none sampled). Returns the evidence used."""
    basis, limits = range_basis(profile), power_limits(trace, profile, power_limit_w)
    recorded = limits.priced_w == limits.recorded_w
    samples: list[list[dict[str, Any]]] = []
    if spec is not None and (pairs or not recorded):
        with progress_bar("parameter samples") as progress:
            samples = [predictions(trace, sample, pairs, power_limit_w)
                       for sample in over_samples(profile, spec, progress)]
    for index, row in enumerate(rows):
        if row["mode"] == "auto" and recorded:
            figures = {key: level_range(row[key], key, basis) for key in RANGED}
            row["range"] = range_json(figures, basis, 0, 0 if spec is None else spec.seed)
            continue
        figures = {key: moved_range(row[key], key, basis, log_deviations(row[key], [s[index][key] for s in samples]))
                   for key in RANGED}
        row["range"] = range_json(figures, basis, len(samples), 0 if spec is None else spec.seed)
    return basis


def window_check(path: str, trace: Trace, profile: GpuProfile) -> dict[str, float | None] | None:
    """For a capture whose steps vary: the measured joules and seconds of its unprofiled window against the sums
    over the window's steps of the predicted auto-mode joules and seconds of each step's own shape, plus the
    one-time set-up of the steps that paid it (as the capture's fit counted them; an older capture: each shape's
    first step) and the window's stalls (``window_stall_s``, the seconds beyond the fit of the steps it left out:
    a kernel module loaded on first use, say; taken as measured, idle at auto's clocks: :func:`stall_power_w`)
    (from the capture's trace set: :func:`kdvfs.envs.trace.trace_set.window_prediction`). Both, as joules alone can
    agree by chance: a step predicted too short at too high a power. ``error`` and ``time_error``: predicted over
    measured, less 1; ``stall_s`` the stalls' seconds (0 for a capture that did not record them); the seconds are
    None for a capture without its window's length. None for other traces."""
    measured = trace.meta.measurements
    measured_j = measured.get("window_energy_j")
    if len(trace.meta.shape_distribution) < 2 or measured_j is None or not Path(path).is_file():
        return None
    captured = {t.meta.step_shape: predictions(with_measured_gaps(t), profile, [])[0]
                for t in load_trace_set(main_path(path)) if t.meta.step_shape is not None}
    totals = {key: window_prediction(trace.meta.shape_distribution, {s: row[key] for s, row in captured.items()},
                                     first_seen=measured.get(first_seen, 0.0),
                                     first_seen_steps=measured.get("window_first_seen_steps"))
              for key, first_seen in (("energy_j", "first_seen_energy_j"), ("step_time_s", "first_seen_step_s"))}
    stall_s, window_s = measured.get("window_stall_s", 0.0), measured.get("window_s")
    predicted_j = totals["energy_j"]["total"] + stall_s * stall_power_w(profile)
    predicted_s = totals["step_time_s"]["total"] + stall_s
    return {"measured_j": measured_j, "predicted_j": predicted_j, "steps": totals["energy_j"]["steps"],
            "captured_steps": totals["energy_j"]["captured_steps"], "error": predicted_j / measured_j - 1,
            "stall_s": stall_s, "measured_s": window_s, "predicted_s": predicted_s,
            "time_error": None if not window_s else predicted_s / window_s - 1}


def stall_power_w(profile: GpuProfile) -> float:
    """The cost model's power of the GPU idle at auto's clocks (the highest core clock, the default memory clock;
    W): what a second of a stall, with no kernel to run, costs in the window check."""
    params, limits = CostParams.from_profile(profile), ClockLimits.of(profile)
    return float(idle_power_w(params, limits, np.array(limits.max_core_mhz),
                              np.array(float(profile.clocks.default_memory_mhz))))


def run(args: argparse.Namespace) -> int:
    trace, profile = with_measured_gaps(open_trace(args.trace)), load_profile(args.gpu)
    limits = power_limits(trace, profile, args.power_limit_w)
    rows = predictions(trace, profile, args.pair, args.power_limit_w)
    result: dict[str, Any] = {"trace": trace.meta.workload, "gpu": profile.name, "power_limit": limits.as_json(),
                              "measured": dict(trace.meta.measurements), "predictions": rows}
    window = window_check(args.trace, trace, profile)
    if window is not None:
        result["window"] = window
    basis = with_ranges(rows, trace, profile, args.pair, spec_from_args(args, vary_latency=False),
                        args.power_limit_w)
    note = _measured_elsewhere(trace, profile)
    if args.json:
        print_json(result)
    else:
        console.print(breakdown_table(result, caption=limits.describe()))
        for line in basis_lines(basis, samples=max(row["range"]["parameter_samples"] for row in rows)):
            console.print(line)
        if window is not None:
            console.print(f"window of {window['steps']:.0f} steps of mixed shapes ({window['captured_steps']:.0f} of a "
                          f"captured shape, the others scaled from the nearest by size; stalls "
                          f"{window['stall_s']:.2f} s as measured, idle): measured "
                          f"{window['measured_j']:.1f} J, predicted {window['predicted_j']:.1f} J "
                          f"({window['error']:+.1%})" + ("" if window["time_error"] is None else
                                                        f"; {window['measured_s']:.2f} s, predicted "
                                                        f"{window['predicted_s']:.2f} s ({window['time_error']:+.1%})"))
    if note:
        print(f"kdvfs: {note}", file=sys.stderr)
    return 0
