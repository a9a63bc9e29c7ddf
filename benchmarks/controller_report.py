"""Figures of ``benchmarks/controller_h200.py run``: controller overhead and timing error (see that module)."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from envs.bundled import open_trace
from envs.kineto import split_steps
from envs.paths import REPO_ROOT
from runtime.capture.cpu_emulation import emulate_gpu_recording
from runtime.controller.config import ControllerConfig
from runtime.controller.source import load_plan
from runtime.controller.timeline import StepPlan

RESULTS = REPO_ROOT / "benchmarks" / "results"
SETTLE_STEPS = 10
TARGETS = {"overhead": 0.01, "median_ms": 0.5, "p99_ms": 2.0}
DISCUSSION = """
## Discussion (written for the H200 runs of 2026-11-29; re-check it after a new run)

- Applied schedule: `controller_h200.plan-gpt3xl-b4.json`, `kdvfs plan --method latency-optimal
  --slowdown 0.01` of `h200/capture-gpt3xl-b4` (the step this script runs): 1770 MHz for kernels 0-1786,
  1290 MHz from kernel 1787 (the last backward kernel, then the optimizer), memory 3201 MHz; predicted
  2.06% energy saved at 0.99% slowdown with 6 ms switching. GPT-2 small: a one-segment plan
  (`...plan-gpt2s-b16.json`): one or two requests per controller run.
- Dry run only. Every controller used `benchmarks.nvml_guard` (real pynvml; any Set/Reset/Clear call is
  refused and counted): zero refused, zero state-changing calls, in the `kdvfs run` process and both
  benchmark processes (`nvml_in_children` in the JSON).
- Overhead: met with a wide margin; the per-pair spread (about +-0.4%) is the GPU's own step-time noise.
- Timing: NOT met. What the error is made of:
  - step start: the controller's step-end estimate (CUDA event GPU time plus the minimum host offset)
    jitters by ~2 us around the profiled step ends; its constant lag was 30-40 us in the first run, where
    the profiler also recorded CPU-side marks (the second run maps clocks by the median step end instead);
  - within the step: the controller stretches the captured timeline by the recent measured step times, so
    an error in a step's length grows along the step. Under the profiler, step times jumped between 152 and
    164 ms from one step to the next (148.5-149.8 ms for the unprofiled steps just before), and the
    switch instants near the step's end (kernel 1787 and the next step's start) inherit that: median
    2.4 ms, p99 10.5 ms. In the one profiled step whose length the previous ones predicted within 0.1%
    (152.86 against 152.77 ms), kernel starts were off by 0.33 ms median, 0.62 ms at most;
  - the first run, profiling CPU ops too (a heavier perturbation) and a 3-step median, gave switch instants
    5.1 ms median, 8.3 ms p99 (12 instants);
  - `step_ends_unprofiled` (5 steps, no profiler) is the controller's own prediction of the next step end
    against the CUDA events: median 1.0 ms, and one 17 ms step: in both runs steps 6-7 after the controller
    started ran 157-169 ms without the profiler; the cause was not established.
  A predictor anchored only at step boundaries cannot do better than the step-to-step variation of the step
  time; meeting 0.5 ms needs anchors inside the step (e.g. a CUDA event at the optimizer's pre-step hook)
  and a measurement that perturbs less than the PyTorch profiler. Left open.
- The guard backed off in both `kdvfs run` dry runs after ~20 controlled steps (+1.55% and +1.90% against
  a baseline taken while the GPU was cold, limit 1.5%): in a dry run nothing was applied, so that was the
  GPU's own drift. The guard now re-measures the baseline at the first excess and backs off only at a
  second one; that version was tested on the fake device, not rerun on the H200.
- The end-to-end `kdvfs run` figures (summary in the JSON) count 150 steps, its energy windows 104.9 J per
  step at 151.4 ms (NVML energy counter; the capture measured 105.4 J at 152.6 ms).
"""


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
            "windows": len(windows), "steps_per_window": windows[0]["steps"]}


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


def timing_figures(folder: Path, document: dict[str, Any], cpu_test: bool) -> dict[str, Any]:
    """Planned switch instants and predicted kernel starts against the profiled kernel starts."""
    profile = folder / document["profile"]
    if cpu_test:
        emulated = folder / "emulated.profile.json"
        emulate_gpu_recording(profile, emulated)
        profile = emulated
    recording, _ = split_steps(profile)
    acts = recording.activities
    plan = _step_plan(document)
    trace_names = [k.name for k in open_trace(document["trace"]).kernels]
    starts = [i for i in sequence_starts([a.name for a in acts], trace_names) if i > 0]
    boundaries_us = [acts[i - 1].start_us + acts[i - 1].dur_us for i in starts]
    records = [r for r in document["log"] if r["event"] == "step"]
    offset_us, shift = clock_offset_us(boundaries_us, [r["end_s"] for r in records])
    steps = {records[j + shift]["step"] + 1: (start, records[j + shift]) for j, start in enumerate(starts)
             if records[j + shift]["next_controlled"]}
    switch, every, jitter = [], [], []
    for record in (r for r in document["log"] if r["event"] == "request" and r["step"] in steps):
        actual_us = acts[steps[record["step"]][0] + record["kernel"]].start_us
        switch.append((record["due_s"] * 1e6 + offset_us - actual_us) / 1e3)
    for first, record in steps.values():
        predicted_us = (record["end_s"] + record["scale"] * plan.kernel_start_s) * 1e6 + offset_us
        actual_us = np.array([a.start_us for a in acts[first:first + len(trace_names)]])
        every += list((predicted_us - actual_us) / 1e3)
        jitter.append((record["end_s"] * 1e6 + offset_us - (acts[first - 1].start_us + acts[first - 1].dur_us)) / 1e3)
    return {"profiled_steps_with_trace_sequence": len(starts), "controlled_profiled_steps": len(steps),
            "step_ends_unprofiled": _errors_ms(step_end_errors_ms(records, plan, profiled=False)),
            "step_ends_profiled": _errors_ms(step_end_errors_ms(records, plan, profiled=True)),
            "trace_kernels": len(trace_names), "clock_offset_us": offset_us,
            "step_end_jitter_ms": _errors_ms(jitter), "switch_instants": _errors_ms(switch),
            "kernel_starts": _errors_ms(every)}


def _verdict(value: float | None, limit: float) -> str:
    return "n/a" if value is None else ("met" if value <= limit else "NOT met")


def _markdown(result: dict[str, Any]) -> str:
    run, lines = result["run"], ["# Clock controller on an NVIDIA H200, dry run only", ""]
    lines += [f"- command: `{result['command']}`",
              f"- machine: host `{run['machine']}`, Python {run['python']}, {run['started_utc']} to "
              f"{run['finished_utc']}; GPU (nvidia-smi before): `{run['nvidia_smi_before']}`",
              f"- end-to-end: `{run['cli']['command']}` ({run['cli']['wall_s']:.0f} s): "
              f"{run['cli']['summary']['steps']} steps, {run['cli']['summary']['controlled_steps']} controlled, "
              f"{run['cli']['logged_requests']} requests logged; NVML calls: {run['cli']['nvml']}", "",
              "## Overhead on step time (with / without the controller, same process, windows ABBA)", "",
              "| workload | without (ms/step) | with (ms/step) | overhead | per pair | target <= 1% |",
              "| --- | ---: | ---: | ---: | --- | --- |"]
    for label, o in result["overhead"].items():
        pairs = ", ".join(f"{p:+.2%}" for p in o["pair_overheads"])
        lines.append(f"| {label} | {o['step_time_without_ms']:.2f} | {o['step_time_with_ms']:.2f} | "
                     f"{o['overhead']:+.2%} | {pairs} | {_verdict(o['overhead'], TARGETS['overhead'])} |")
    lines += ["", "## Timing error against the profiled kernel starts (planned minus actual)", "",
              "| workload | what | count | median abs (ms) | p99 abs (ms) | max abs (ms) | median signed (ms) | "
              "targets (median <= 0.5, p99 <= 2 ms) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for label, t in result["timing"].items():
        for what in ("switch_instants", "kernel_starts", "step_ends_profiled", "step_ends_unprofiled"):
            e = t[what]
            if not e["count"]:
                lines.append(f"| {label} | {what} | 0 | - | - | - | - | n/a |")
                continue
            met = "met" if e["median_abs_ms"] <= TARGETS["median_ms"] and e["p99_abs_ms"] <= TARGETS["p99_ms"] \
                else "NOT met"
            lines.append(f"| {label} | {what} | {e['count']} | {e['median_abs_ms']:.3f} | {e['p99_abs_ms']:.3f} | "
                         f"{e['max_abs_ms']:.3f} | {e['median_signed_ms']:+.3f} | {met} |")
        lines.append(f"\n{label}: {t['profiled_steps_with_trace_sequence']} profiled steps ran the trace's "
                     f"{t['trace_kernels']}-kernel sequence, {t['controlled_profiled_steps']} of them controlled; the "
                     f"controller's step-end estimate jitters by {t['step_end_jitter_ms'].get('median_abs_ms', 0):.3f} "
                     "ms (median abs) around the profiled step ends.")
    return "\n".join(lines) + "\n" + result.get("notes", "")


def report(folder: Path, cpu_test: bool) -> None:
    """Write ``controller_h200.{md,json}`` (into ``folder`` for a CPU test, else ``benchmarks/results``)."""
    run = json.loads((folder / "run.json").read_text())
    children = [json.loads((folder / f"{label}.json").read_text()) for label in run["children"]]
    result = {"command": "python benchmarks/controller_h200.py run DIR (on the GPU machine), then "
                         "python benchmarks/controller_h200.py report DIR",
              "run": run, "targets": TARGETS,
              "overhead": {d["label"]: overhead_figures(d["windows"]) for d in children},
              "timing": {d["label"]: timing_figures(folder, d, cpu_test) for d in children if d["profile"]},
              "nvml_in_children": {d["label"]: d["nvml"] for d in children}, "notes": "" if cpu_test else DISCUSSION}
    out = folder if cpu_test else RESULTS
    (out / "controller_h200.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "controller_h200.md").write_text(_markdown(result))
