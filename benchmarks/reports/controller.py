"""Figures of ``benchmarks/h200/controller.py run``: controller overhead, timing error and online decision time
(see that module); ``controller_markdown.py`` writes them as Markdown."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.provenance import RESULTS, write_results
from benchmarks.reports.controller_arms import arm_differences, split_arms
from benchmarks.reports.controller_markdown import markdown
from benchmarks.reports.controller_timing import timing_figures
from kdvfs.runtime.controller.measurement.estimator import Paired

TARGETS = {"overhead": 0.01, "median_ms": 0.5, "p99_ms": 2.0}
LONG_STEP = 1.5
"""A step over this many times its window's median step counts as long (:func:`step_figures`)."""


def overhead_figures(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Step time with over without the controller: overall, and per adjacent (ABBA) pair of windows."""
    per_step = [(w["controller"], w["elapsed_s"] / w["steps"]) for w in windows]
    on = [t for c, t in per_step if c]
    off = [t for c, t in per_step if not c]
    pairs = []
    for a, b in zip(per_step[0::2], per_step[1::2], strict=True):
        with_s, without_s = (a[1], b[1]) if a[0] else (b[1], a[1])
        pairs.append(with_s / without_s - 1.0)
    return {"step_time_with_ms": 1e3 * statistics.mean(on), "step_time_without_ms": 1e3 * statistics.mean(off),
            "overhead": statistics.mean(on) / statistics.mean(off) - 1.0, "pair_overheads": pairs,
            "pair_mean": statistics.mean(pairs), "pair_ci95": list(mean_interval(pairs)),
            "windows": len(windows), "steps_per_window": windows[0]["steps"], "steps": step_figures(windows),
            **cpu_figures(windows)}


def step_figures(windows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Where the overhead shows, from the host time at each step's hook (runs that recorded it): the overhead
    of the windows' median steps (mean of ABBA pairs [95% CI]) and the share of a window's time in steps over
    ``LONG_STEP`` times its median step, each for the windows without / with the controller."""
    if not all(w.get("step_s") for w in windows):
        return None
    medians = [(w["controller"], statistics.median(w["step_s"])) for w in windows]
    pairs = [(a if a_on else b) / (b if a_on else a) - 1.0
             for (a_on, a), (_, b) in zip(medians[0::2], medians[1::2], strict=True)]

    def arm(on: bool) -> dict[str, Any]:
        chosen = [w for w in windows if w["controller"] == on]
        long_share = [sum(s for s in w["step_s"] if s > LONG_STEP * statistics.median(w["step_s"]))
                      / sum(w["step_s"]) for w in chosen]
        return {"median_step_ms": 1e3 * statistics.mean(m for c, m in medians if c == on),
                "long_step_share": statistics.mean(long_share)}

    return {"median_step_pairs": pairs, "median_step_pair_mean": statistics.mean(pairs),
            "median_step_pair_ci95": list(mean_interval(pairs)), "without": arm(False), "with": arm(True),
            "pairs": [pair_detail(a, b) for a, b in zip(windows[0::2], windows[1::2], strict=True)]}


def pair_detail(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """One ABBA pair: its overhead and the steps the controller controlled in its window."""
    on, off = (first, second) if first["controller"] else (second, first)
    return {"overhead": on["elapsed_s"] / off["elapsed_s"] - 1.0,
            "controlled_steps": on["summary"]["controlled_steps"] if on["summary"] else None}


def mean_interval(values: list[float]) -> tuple[float, float]:
    """The 95% t interval of the mean of ``values``, as the controller's A/B estimator computes it
    (:class:`~kdvfs.runtime.controller.measurement.estimator.Paired`); unbounded for one value."""
    paired = Paired()
    for value in values:
        paired.add(value)
    found = paired.interval()
    return (-math.inf, math.inf) if found is None else (found.lo_pct, found.hi_pct)


def cpu_figures(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The controller's CPU time per step in the windows with it (ms; summaries that record it): its thread,
    the hooks on the training threads, the energy thread; and the share of steps it controlled."""
    summaries = [w["summary"] for w in windows if w["controller"] and w["summary"]
                 and w["summary"].get("controller_cpu_ms")]
    if not summaries:
        return {}
    steps = sum(s["steps"] for s in summaries)
    return {"cpu_ms_per_step": {
        "thread": sum(s["controller_cpu_ms"]["thread"] for s in summaries) / steps,
        "end_wait": _per_step(summaries, "thread_end_wait", steps),
        "issue": _per_step(summaries, "thread_issue", steps),
        "hooks": sum(s["controller_cpu_ms"]["hooks"] or 0.0 for s in summaries) / steps,
        "energy": sum(1e3 * ((s.get("energy_counter") or {}).get("thread_cpu_s") or 0.0) for s in summaries) / steps,
        "online": sum(s["online"]["cpu_ms"] for s in summaries if s.get("online")) / steps},
        "controlled_share": sum(s["controlled_steps"] for s in summaries) / steps}


def _per_step(summaries: list[dict[str, Any]], part: str, steps: int) -> float | None:
    """The controller thread's CPU ``part`` of ``controller_cpu_ms`` over ``steps`` steps (ms a step; None where a
    summary has none: runs from before it was recorded)."""
    if any(s["controller_cpu_ms"].get(part) is None for s in summaries):
        return None
    return sum(s["controller_cpu_ms"][part] for s in summaries) / steps


def decision_figures(document: dict[str, Any]) -> dict[str, Any]:
    """The online policy's decision wall times on the controller's thread: its evaluations (the profiled
    window's ``decision`` log records), every decision point and the warm-ups before them (the controlled
    windows' summaries)."""
    walls_us = [r["wall_us"] for r in document["log"] if r["event"] == "decision"]
    onlines = [w["summary"]["online"] for w in document["windows"] if w["summary"] and w["summary"].get("online")]
    points = [o["decision_point_us"] for o in onlines if o["decision_point_us"]["median"] is not None]
    evaluations = [o["decision_us"] for o in onlines if o["decision_us"]["median"] is not None]
    warm_ups = [o["warm_us"] for o in onlines if (o.get("warm_us") or {}).get("median") is not None]
    progress: dict[str, int] = {}
    wakes: dict[str, float] = {}
    steps = sum(w["summary"]["steps"] for w in document["windows"] if w["summary"] and w["summary"].get("online"))
    for o in onlines:
        for source, count in o["progress"].items():
            progress[source] = progress.get(source, 0) + count
        for reason, count in o["wakes"].items():
            wakes[reason] = wakes.get(reason, 0) + count / steps
    return {"decisions": len(walls_us),
            "decision_us_median": float(np.median(walls_us)) if walls_us else None,
            "decision_us_p99": float(np.percentile(walls_us, 99)) if walls_us else None,
            "windows_decision_us_median_of_medians": _median_of(evaluations),
            "windows_decision_us_p99_max": max((e["p99"] for e in evaluations), default=None),
            "point_us_median_of_windows": _median_of(points),
            "point_us_p99_max_of_windows": max((p["p99"] for p in points), default=None),
            "warm_us_median_of_windows": _median_of(warm_ups),
            "warm_us_p99_max_of_windows": max((w["p99"] for w in warm_ups), default=None),
            "warm_ms_per_step": sum(o["warm_ms"] for o in onlines) / steps if warm_ups else None,
            "progress_sources": progress, "wakes_per_step": wakes,
            "interval_ms": onlines[0]["interval_ms"] if onlines else None, "lead_ins": lead_in_figures(document)}


def _median_of(quantiles: list[dict[str, Any]]) -> float | None:
    """The median of the windows' medians; None without windows."""
    return float(np.median([q["median"] for q in quantiles])) if quantiles else None


def lead_in_figures(document: dict[str, Any]) -> dict[str, Any] | None:
    """The lead-ins the thread slept through in the windows (summaries' ``lead_in``): how many,
    how many the GPU passed the first anchor late in (the median of the windows' medians and the worst p99, ms),
    how many never reached it by the give-up time; None for runs whose summaries lack it."""
    leads = [w["summary"]["lead_in"] for w in document["windows"] if w["summary"] and w["summary"].get("lead_in")]
    if not leads:
        return None
    late = [d["late_ms"] for d in leads if d["late_ms"]["median"] is not None]
    return {"waits": sum(d["waits"] for d in leads), "late": sum(d["late"] for d in leads),
            "missed": sum(d["missed"] for d in leads),
            "late_ms_median_of_windows": float(np.median([d["median"] for d in late])) if late else None,
            "late_ms_p99_max": max((d["p99"] for d in late), default=None)}


def report(folder: Path, cpu_test: bool, name: str = "controller_h200") -> None:
    """Write ``NAME.{md,json}`` (into ``folder`` for a CPU test, else ``benchmarks/results``)."""
    run = json.loads((folder / "run.json").read_text())
    children = [part for label in run["children"] for part in split_arms(json.loads((folder / f"{label}.json")
                                                                                     .read_text()))]
    for child in children:  # a trace captured in the run: beside the results, not at its device path
        captured = folder / Path(child["trace"]).name
        if child["trace"].endswith(".json") and not Path(child["trace"]).exists() and captured.exists():
            child["trace"] = str(captured)
    overhead = {d["label"]: overhead_figures(d["windows"]) for d in children}
    arms = arm_differences(children, {label: o["pair_overheads"] for label, o in overhead.items()})
    ran = run.get("command", "python -m benchmarks.h200.controller run DIR")
    result = {"command": f"{ran} (on the GPU machine), then python -m benchmarks.h200.controller report DIR",
              "run": run, "targets": TARGETS, "long_step": LONG_STEP,
              "overhead": overhead,
              "arms": {label: {**a, "mean": statistics.mean(a["differences"]),
                               "ci95": list(mean_interval(a["differences"]))} for label, a in arms.items()},
              "timing": {d["label"]: timing_figures(folder, d, cpu_test) for d in children if d["profile"]},
              "decisions": {d["label"]: decision_figures(d) for d in children},
              "nvml_in_children": {d["label"]: d["nvml"] for d in children}}
    write_results(name, result, markdown(result), indent=1, folder=folder if cpu_test else RESULTS)
