"""The controller benchmark's timing error: where the controller planned its switch instants and expected each
kernel to start (from the step's start, and re-placed on its logged anchors) against the kernel starts in the
profiled window (``benchmarks/h200/controller.py``, whose docstring says how the two clocks are mapped); it
reads the controller's log records (``start``, ``step``, ``anchor_map``, ``request``) as the benchmark's child
process keeps them."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.reports.controller_windows import SETTLE_STEPS
from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.importing import read_recording
from kdvfs.runtime.capture.cpu_emulation import emulate_gpu_recording
from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.event_log import seconds
from kdvfs.runtime.controller.model.plan import load_plan
from kdvfs.runtime.controller.model.step_plan import StepPlan
from kdvfs.runtime.controller.timing.pace import host_offsets_s


def sequence_starts(names: list[str], step_names: list[str]) -> list[int]:
    """Indices where ``names`` (profiled activities in time order) repeat the whole step sequence."""
    size, starts, i = len(step_names), [], 0
    while i + size <= len(names):
        if names[i] == step_names[0] and names[i:i + size] == step_names:
            starts.append(i)
            i += size
        else:
            i += 1
    return starts


def clock_offset_us(boundaries_us: list[float], ends_s: list[float]) -> tuple[float, int]:
    """Profiler time minus host time (us) and the index shift pairing profiled step boundaries with the
    controller's step ends: the shift whose differences spread least, their median."""
    best: tuple[float, float, int] | None = None
    for shift in range(len(ends_s) - len(boundaries_us) + 1):
        diffs = [b - 1e6 * ends_s[j + shift] for j, b in enumerate(boundaries_us)]
        spread = max(diffs) - min(diffs)
        if best is None or spread < best[0]:
            best = (spread, statistics.median(diffs), shift)
    if best is None:
        raise ValueError("more profiled steps than logged step ends")
    return best[1], best[2]


def _step_plan(document: dict[str, Any]) -> StepPlan:
    config = ControllerConfig(policy=str(REPO_ROOT / document["plan"]), trace=document["trace"], dry_run=True)
    plan = load_plan(config, "NVIDIA H200")
    return StepPlan.build(plan.problem, plan.schedule, dry_run=True)


def _errors_ms(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    errors = np.abs(np.asarray(values))
    return {"count": len(values), "median_abs_ms": float(np.median(errors)),
            "p99_abs_ms": float(np.percentile(errors, 99)), "max_abs_ms": float(errors.max()),
            "median_signed_ms": float(np.median(values))}


def step_end_errors_ms(records: list[dict[str, Any]], plan: StepPlan, profiled: bool) -> list[float]:
    """Each step's end as the controller predicted it at the previous step's end (previous end plus the
    scaled expected step time) minus its end from the CUDA events, for steps run without (or with) the
    profiler (the profiled window starts at step ``SETTLE_STEPS``)."""
    errors = []
    for before, after in itertools.pairwise(records):
        if before["matched"] and before["duration_s"] is not None and (after["step"] >= SETTLE_STEPS) == profiled:
            expected_s = plan.expected_s if before["next_controlled"] else plan.auto_s
            errors.append(1e3 * (before["end_s"] + before["scale"] * expected_s - after["end_s"]))
    return errors


def anchored_starts_s(plan: StepPlan, log: list[dict[str, Any]], step: dict[str, Any], start_s: float,
                      scale: float, pace_s: list[float] | None = None) -> np.ndarray:
    """Every kernel's start in ``step`` (its log record) as the controller would place a change due at it: on
    the latest anchor of the map in effect that precedes it by the latency and margin (``runtime/controller/
    timing/anchors.py``; its live checks of order and distance are not repeated), else from the step's start; times
    from either at the step's pace logged by the step before (``pace_s``; ``runtime/controller/timing/pace.py``), else
    on the timeline stretched by ``scale``."""
    start = next(r for r in log if r["event"] == "start")
    maps = [r for r in log if r["event"] == "anchor_map" and r["step"] < step["step"]]
    anchors_s = np.asarray(seconds(step, "anchors") or [])
    positions_s = np.asarray(maps[-1]["positions_s"]) if maps else np.zeros(0)
    if pace_s is not None and len(pace_s) == len(positions_s) + 1 and len(positions_s):
        knots_s = np.concatenate([[0.0], positions_s, [plan.expected_s]])
        host_s, at_anchors_s = (host_offsets_s(np.asarray(pace_s), knots_s, times_s)
                                for times_s in (plan.kernel_start_s, positions_s))
    else:
        host_s, at_anchors_s = scale * plan.kernel_start_s, scale * positions_s
    if not len(positions_s) or len(positions_s) != len(anchors_s):
        return start_s + host_s
    latest_s = plan.kernel_start_s - (start["latency_s"] + (start.get("anchor_margin_s") or 0.0)) / scale
    index = np.searchsorted(positions_s, latest_s, side="right") - 1
    on = np.clip(index, 0, None)
    return np.where(index >= 0, anchors_s[on] + host_s - at_anchors_s[on], start_s + host_s)


def gap_error_ms(due_us: float, previous_end_us: float, start_us: float) -> float:
    """A step's first change against the GPU's idle gap before the step's first kernel: 0 if it is due inside
    [the previous step's last kernel's end, the first kernel's start] (us), else how far outside (ms; negative:
    before the gap, while the previous step still ran)."""
    return (min(due_us - previous_end_us, 0.0) + max(due_us - start_us, 0.0)) / 1e3


def request_figures(log: list[dict[str, Any]], steps: set[int]) -> dict[str, Any]:
    """Of the requests of ``steps``: how many were placed on an anchor, how long before its change each was
    issued (the switching latency ahead is the aim) and how late the thread woke after its anchor."""
    latency_s = next(r for r in log if r["event"] == "start")["latency_s"]
    requests = [r for r in log if r["event"] == "request" and r["step"] in steps]
    leads_ms = [1e3 * (r["due_s"] - r["issued_s"]) for r in requests]
    wakes_ms = [1e3 * (r["woke_s"] - r["anchor_s"]) for r in requests if r.get("anchor") is not None]
    return {"requests": len(requests), "anchored": len(wakes_ms), "latency_ms": 1e3 * latency_s,
            "lead_ms_min": min(leads_ms, default=None), "lead_ms_median": float(np.median(leads_ms)) if leads_ms
            else None, "issued_a_latency_ahead": sum(lead >= 1e3 * latency_s - 0.05 for lead in leads_ms),
            "anchor_wake_ms_median": float(np.median(wakes_ms)) if wakes_ms else None,
            "anchor_wake_ms_max": max(wakes_ms, default=None)}


def pace_figures(log: list[dict[str, Any]], plan: StepPlan) -> dict[str, Any]:
    """Each stretch of the step between its start, its anchors (where the last anchor map puts them) and its end:
    live over planned time, in every matched step with those anchors (median, least, most; the first stretch's
    median also over the controlled steps and those at auto apart), with the steps' scale (measured over
    expected step time) for comparison; ``runtime/controller/timing/pace.py`` learns the same."""
    maps = [r for r in log if r["event"] == "anchor_map"]
    if not maps:
        return {"steps": 0}
    knots_s = np.concatenate([[0.0], maps[-1]["positions_s"], [plan.expected_s]])
    records = [r for r in log if r["event"] == "step"]
    pairs = [(before, after) for before, after in itertools.pairwise(records)
             if after["matched"] and len(seconds(after, "anchors") or []) == len(knots_s) - 2]
    if not pairs:
        return {"steps": 0}
    stacked = np.stack([np.diff(np.concatenate([[before["end_s"]], seconds(after, "anchors"), [after["end_s"]]]))
                        for before, after in pairs]) / np.diff(knots_s)
    controlled = np.array([after["controlled"] for _, after in pairs])
    lead_in = {key: float(np.median(stacked[rows, 0])) if rows.any() else None
               for key, rows in (("controlled", controlled), ("auto", ~controlled))}
    return {"steps": len(pairs), "median": np.median(stacked, axis=0).tolist(), "least": stacked.min(0).tolist(),
            "most": stacked.max(0).tolist(), "lead_in_median": lead_in,
            "scale_median": float(np.median([r["scale"] for r in records]))}


def timing_figures(folder: Path, document: dict[str, Any], cpu_test: bool) -> dict[str, Any]:
    """Planned switch instants and predicted kernel starts against the profiled kernel starts."""
    profile = folder / document["profile"]
    if cpu_test:
        emulated = folder / "emulated.profile.json"
        emulate_gpu_recording(profile, emulated)
        profile = emulated
    acts = read_recording(profile).activities
    plan = _step_plan(document)
    trace_names = [k.name for k in open_trace(document["trace"]).kernels]
    starts = [i for i in sequence_starts([a.name for a in acts], trace_names) if i > 0]
    boundaries_us = [acts[i - 1].start_us + acts[i - 1].dur_us for i in starts]
    records = [r for r in document["log"] if r["event"] == "step"]
    offset_us, shift = clock_offset_us(boundaries_us, [r["end_s"] for r in records])
    steps = {records[j + shift]["step"] + 1: (start, records[j + shift]) for j, start in enumerate(starts)
             if records[j + shift]["next_controlled"]}
    switch, at_first, in_gap, every, anchored, jitter = [], [], [], [], [], []
    for record in (r for r in document["log"] if r["event"] == "request" and r["step"] in steps):
        first = steps[record["step"]][0]
        due_us, actual_us = record["due_s"] * 1e6 + offset_us, acts[first + record["kernel"]].start_us
        (at_first if record["kernel"] == 0 else switch).append((due_us - actual_us) / 1e3)
        if record["kernel"] == 0:
            in_gap.append(gap_error_ms(due_us, acts[first - 1].start_us + acts[first - 1].dur_us, actual_us))
    by_step = {r["step"]: r for r in records}
    for step, (first, record) in steps.items():
        actual_us = np.array([a.start_us for a in acts[first:first + len(trace_names)]])
        predicted_us = (record["end_s"] + record["scale"] * plan.kernel_start_s) * 1e6 + offset_us
        every += list((predicted_us - actual_us) / 1e3)
        if step in by_step:
            placed_s = anchored_starts_s(plan, document["log"], by_step[step], record["end_s"], record["scale"],
                                         seconds(record, "pace"))
            anchored += list((placed_s * 1e6 + offset_us - actual_us) / 1e3)
        jitter.append((record["end_s"] * 1e6 + offset_us - (acts[first - 1].start_us + acts[first - 1].dur_us)) / 1e3)
    return {"profiled_steps_with_trace_sequence": len(starts), "controlled_profiled_steps": len(steps),
            "step_ends_unprofiled": _errors_ms(step_end_errors_ms(records, plan, profiled=False)),
            "step_ends_profiled": _errors_ms(step_end_errors_ms(records, plan, profiled=True)),
            "trace_kernels": len(trace_names), "clock_offset_us": offset_us,
            "step_end_jitter_ms": _errors_ms(jitter), "switch_instants": _errors_ms(switch + at_first),
            "switch_instants_in_step": _errors_ms(switch), "switch_instants_first_kernel": _errors_ms(at_first),
            "switch_instants_first_kernel_gap": _errors_ms(in_gap), "switch_instants_gap": _errors_ms(switch + in_gap),
            "kernel_starts": _errors_ms(every), "kernel_starts_anchored": _errors_ms(anchored),
            "requests": request_figures(document["log"], set(steps)), "pace": pace_figures(document["log"], plan),
            "requests_all_steps": request_figures(document["log"], {r["step"] for r in records} | {len(records)})}
