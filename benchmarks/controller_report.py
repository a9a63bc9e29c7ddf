"""Figures of ``benchmarks/controller_h200.py run``: controller overhead and timing error (see that module)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np
from controller_arms import arm_differences, arm_lines, split_arms
from controller_timing import timing_figures
from provenance import RESULTS, write_results

from kdvfs.runtime.controller.estimator import Paired

TARGETS = {"overhead": 0.01, "median_ms": 0.5, "p99_ms": 2.0}
LONG_STEP = 1.5
"""A step over this many times its window's median step counts as long (:func:`step_figures`)."""
DISCUSSION = """
## Discussion (written for the H200 run of 2026-11-30 00:30 UTC with the shipped policy; re-check it after a new run)

- Applied schedule (this run): the shipped H200 policy, `policies/h200.kdvfs-policy.npz`, rolled out by the
  controller on `h200/capture-gpt3xl-b4` (the step this script runs) at a 1% budget: auto until kernel 896,
  1770 MHz from kernel 897 (in the backward pass), 1290 MHz from kernel 1801 (the optimizer), memory
  3201 MHz, back to auto at the next step's start; predicted 1.80% energy saved at 0.94% slowdown with 6 ms
  switching. Each controlled step has three switch instants. GPT-2 small (`h200/capture-gpt2s-b16`): one
  locked pair all step (1890 MHz), so no switch instant inside the step.
- Dry run only. Every controller used `benchmarks.nvml_guard` (real pynvml; any Set/Reset/Clear call is
  refused and counted): zero refused, zero state-changing calls, in the `kdvfs run` process and both
  benchmark processes (`nvml_in_children` in the JSON).
- The controller records CUDA events inside the step (before each of the 24 blocks' forward, when each
  block's output gradient is ready, and before the optimizer step: 49 a step, all found and learned) and
  places each request on the latest anchor at least latency + 2 ms before the change
  (`runtime/controller/anchoring.py`). Before the anchors (step-level timeline only) the first H200 runs
  gave switch instants 2.40 ms median, 10.5 ms p99.
- Timing: met. Switch instants 0.11 ms median, 0.74 ms p99 (30 instants in 10 profiled controlled steps);
  every kernel start re-placed offline on the logged anchors by the same rule: 0.21 ms median, 1.23 ms p99
  (16695 starts), against 0.78 ms / 6.9 ms from the step's start alone in the same steps. Earlier runs of
  the same controller: with the latency-optimal plan of this step (2 instants a step) 0.15 ms / 0.71 ms;
  with an earlier policy (16 instants a step, 1740/1770 MHz alternating) 0.22 ms / 0.91 ms.
- Requests: the thread woke 0.24 ms (median), 1.87 ms (most) after the GPU passed the anchor it waited on;
  requests went out 6.09 ms (median) before their change, 25 of 30 at least the 6 ms latency ahead (the
  other 5 between 5.1 and 6 ms: late wake-ups eat into the 0.25 ms `issue_early_ms` allowance). Over the
  whole run, the change sent at once when control (re)starts is late by design.
- Overhead: met (+0.04% GPT-3 XL, +0.02% GPT-2 small, windows ABBA); per-pair spread +-0.3%, the GPU's own
  step-time noise. The anchors cost ~49 event records and tensor hooks per step on the training side.
- Step-end prediction (`step_ends_*`, the step-level figure): still off by up to 7-15 ms on the slow steps;
  it no longer drives the switch instants where an anchor is available.
- End to end (`kdvfs run --dry-run`, 150 steps): 127 controlled, 381 requests logged (the dry-run log
  counts every planned request, three a step), no mismatch; the guard re-measured its baseline once and
  did not back off.
- The measurement itself perturbs: under the profiler, step times vary by several ms from step to step
  (149-151 ms without it).
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
            "pair_mean": statistics.mean(pairs), "pair_ci95": list(mean_interval(pairs)),
            "windows": len(windows), "steps_per_window": windows[0]["steps"], "steps": step_figures(windows),
            **cpu_figures(windows)}


def step_figures(windows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Where the overhead shows, from the host time at each step's hook (runs that recorded it): the overhead
    of the windows' median steps (mean of ABBA pairs [95% CI]), the share of a window's time in steps over
    ``LONG_STEP`` times its median step, and the garbage-collection passes per window (count and ms, by
    generation), each for the windows without / with the controller."""
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
                "long_step_share": statistics.mean(long_share),
                "gc_per_window": {g: [statistics.mean(w["gc"][g][0] for w in chosen),
                                      1e3 * statistics.mean(w["gc"][g][1] for w in chosen)] for g in "012"},
                **({"blocked_share": sample_shares([w["training_thread_samples"] for w in chosen])}
                   if "training_thread_samples" in chosen[0] else {}),
                **({"training_thread_per_step": {key: statistics.mean(w["training_thread"][key] / w["steps"]
                                                                      for w in chosen)
                                                 for key in chosen[0]["training_thread"]}}
                   if "training_thread" in chosen[0] else {})}

    return {"median_step_pairs": pairs, "median_step_pair_mean": statistics.mean(pairs),
            "median_step_pair_ci95": list(mean_interval(pairs)), "without": arm(False), "with": arm(True),
            "pairs": [pair_detail(a, b) for a, b in zip(windows[0::2], windows[1::2], strict=True)]}


def sample_shares(samples: list[dict[str, int]]) -> dict[str, float]:
    """The windows' samples of each sampled thread (``running`` or the system call it slept in; an autograd
    thread's keyed ``NAME: what``) as shares of that thread's samples."""
    total: dict[str, int] = {}
    for counts in samples:
        for what, count in counts.items():
            total[what] = total.get(what, 0) + count
    of_thread: dict[str, int] = {}
    for what, count in total.items():
        of_thread[_thread_of(what)] = of_thread.get(_thread_of(what), 0) + count
    return {what: count / max(1, of_thread[_thread_of(what)]) for what, count in total.items()}


def _thread_of(what: str) -> str:
    """The sampled thread a sample's key is of: ``training`` or an autograd thread's name."""
    name, separator, _ = what.partition(": ")
    return name if separator else "training"


def pair_detail(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """One ABBA pair: its overhead, the steps the controller controlled in its window, and the training thread's
    run-queue wait, voluntary (it blocked) and involuntary context switches per step without / with it (where
    recorded)."""
    on, off = (first, second) if first["controller"] else (second, first)
    detail: dict[str, Any] = {"overhead": on["elapsed_s"] / off["elapsed_s"] - 1.0,
                              "controlled_steps": on["summary"]["controlled_steps"] if on["summary"] else None}
    if "training_thread" in on:
        for key in ("waiting_s", "voluntary", "involuntary"):
            detail[key] = [w["training_thread"][key] / w["steps"] for w in (off, on)]
    return detail


def mean_interval(values: list[float]) -> tuple[float, float]:
    """The 95% t interval of the mean of ``values``, as the controller's A/B estimator computes it
    (:class:`~kdvfs.runtime.controller.estimator.Paired`); unbounded for one value."""
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
        "energy": sum(1e3 * (s["energy_thread_cpu_s"] or 0.0) for s in summaries) / steps,
        "online": sum(s["online"]["cpu_ms"] for s in summaries if s.get("online")) / steps},
        "controlled_share": sum(s["controlled_steps"] for s in summaries) / steps}


def _parts(cpu: dict[str, Any]) -> str:
    """The thread's CPU parts a step: waiting for the step ends, issuing, the online decisions (ms; - where not
    recorded)."""
    return ", ".join("-" if cpu.get(k) is None else f"{cpu[k]:.2f}" for k in ("end_wait", "issue", "online"))


def _per_step(summaries: list[dict[str, Any]], part: str, steps: int) -> float | None:
    """The controller thread's CPU ``part`` of ``controller_cpu_ms`` over ``steps`` steps (ms a step; None where a
    summary has none: runs from before it was recorded)."""
    if any(s["controller_cpu_ms"].get(part) is None for s in summaries):
        return None
    return sum(s["controller_cpu_ms"][part] for s in summaries) / steps


def decision_figures(document: dict[str, Any]) -> dict[str, Any]:
    """The online policy's decision wall times on the controller's thread: its evaluations (the profiled
    window's ``decision`` log records) and every decision point (the controlled windows' summaries)."""
    walls_us = [r["wall_us"] for r in document["log"] if r["event"] == "decision"]
    onlines = [w["summary"]["online"] for w in document["windows"] if w["summary"] and w["summary"].get("online")]
    points = [o["decision_point_us"] for o in onlines if o["decision_point_us"]["median"] is not None]
    evaluations = [o["decision_us"] for o in onlines if o["decision_us"]["median"] is not None]
    deciders = [o["decider_us"] for o in onlines if (o.get("decider_us") or {}).get("median") is not None]
    warm_ups = [o["warm_us"] for o in onlines if (o.get("warm_us") or {}).get("median") is not None]
    progress: dict[str, int] = {}
    wakes: dict[str, float] = {}
    steps = sum(w["summary"]["steps"] for w in document["windows"] if w["summary"] and w["summary"].get("online"))
    for o in onlines:
        for source, count in o["progress"].items():
            progress[source] = progress.get(source, 0) + count
        skips = {"lookahead_skips": o["lookahead_skips"]} if "lookahead_skips" in o else {}  # code since 7ff8699
        for reason, count in {**o["wakes"], **skips}.items():
            wakes[reason] = wakes.get(reason, 0) + count / steps
    return {"decisions": len(walls_us),
            "decision_us_median": float(np.median(walls_us)) if walls_us else None,
            "decision_us_p99": float(np.percentile(walls_us, 99)) if walls_us else None,
            "windows_decision_us_median_of_medians": float(np.median([e["median"] for e in evaluations]))
            if evaluations else None,
            "windows_decision_us_p99_max": max((e["p99"] for e in evaluations), default=None),
            "point_us_median_of_windows": float(np.median([p["median"] for p in points])) if points else None,
            "point_us_p99_max_of_windows": max((p["p99"] for p in points), default=None),
            "decider_us_median_of_windows": float(np.median([c["median"] for c in deciders])) if deciders else None,
            "decider_us_p99_max_of_windows": max((c["p99"] for c in deciders), default=None),
            "decider_spin_ms_per_step": sum(o["decider_spin_ms"] for o in onlines) / steps
            if onlines and all(o.get("decider_spin_ms") is not None for o in onlines) else None,
            "warm_us_median_of_windows": float(np.median([w["median"] for w in warm_ups])) if warm_ups else None,
            "warm_us_p99_max_of_windows": max((w["p99"] for w in warm_ups), default=None),
            "warm_ms_per_step": sum(o["warm_ms"] for o in onlines) / steps if warm_ups else None,
            "progress_sources": progress, "wakes_per_step": wakes,
            "interval_ms": onlines[0]["interval_ms"] if onlines else None, "lead_ins": lead_in_figures(document)}


def lead_in_figures(document: dict[str, Any]) -> dict[str, Any] | None:
    """The lead-ins the thread slept through in the windows (summaries' ``lead_in``, code since 7445afd): how many,
    how many the GPU passed the first anchor late in (the median of the windows' medians and the worst p99, ms),
    how many never reached it by the give-up time; None before that code."""
    leads = [w["summary"]["lead_in"] for w in document["windows"] if w["summary"] and w["summary"].get("lead_in")]
    if not leads:
        return None
    late = [d["late_ms"] for d in leads if d["late_ms"]["median"] is not None]
    return {"waits": sum(d["waits"] for d in leads), "late": sum(d["late"] for d in leads),
            "missed": sum(d["missed"] for d in leads),
            "late_ms_median_of_windows": float(np.median([d["median"] for d in late])) if late else None,
            "late_ms_p99_max": max((d["p99"] for d in late), default=None)}


def _decision_lines(result: dict[str, Any]) -> list[str]:
    rows = {label: d for label, d in result["decisions"].items()
            if d["decisions"] or d["windows_decision_us_median_of_medians"] is not None}
    if not rows:
        return []
    lines = ["", "## Online decisions on the controller's thread (wall time, from the wake, or from the end of its "
             "warm-up, to the request out)", "",
             "Profiled window: every policy evaluation in its log. Controlled windows: each window's summary "
             "(the median of their medians, the worst of their p99s). Every decision point: the whole point, "
             "with the next wake's scheduling. In the decider process: the decision's own time in the child process "
             "(`online_process`), every decision point, and how long it polled for them without sleeping per step "
             "(`decider_warm_ms`), or on the thread its throwaway decisions right before the points "
             "(`online_warm_up`); the rest of the point is the pipe, the wake-ups and the interpreter lock.", "",
             "| workload | profiled window: evaluations, median / p99 (us) | controlled windows: median / worst p99 "
             "(us) | every decision point: median / worst p99 (us) | in the decider process: median / worst p99 (us) "
             "| progress from | wakes per step (and evaluations "
             "skipped by looking ahead) | targets (median <= 50, p99 <= 500 us) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, d in rows.items():
        profiled = f"{d['decisions']}, {d['decision_us_median']:.1f} / {d['decision_us_p99']:.1f}" \
            if d["decisions"] else "-"
        windows = "-" if d["windows_decision_us_median_of_medians"] is None else \
            f"{d['windows_decision_us_median_of_medians']:.1f} / {d['windows_decision_us_p99_max']:.1f}"
        point = "-" if d["point_us_median_of_windows"] is None else \
            f"{d['point_us_median_of_windows']:.1f} / {d['point_us_p99_max_of_windows']:.1f}"
        decider = "-" if d.get("decider_us_median_of_windows") is None else \
            f"{d['decider_us_median_of_windows']:.1f} / {d['decider_us_p99_max_of_windows']:.1f}"
        if d.get("decider_spin_ms_per_step") is not None:
            decider += f"; polled {d['decider_spin_ms_per_step']:.2f} ms/step"
        if d.get("warm_us_median_of_windows") is not None:
            decider = (f"thread's warm-ups {d['warm_us_median_of_windows']:.1f} / {d['warm_us_p99_max_of_windows']:.1f}"
                       f", {d['warm_ms_per_step']:.2f} ms/step")
        median, p99 = (d["decision_us_median"], d["decision_us_p99"]) if d["decisions"] else \
            (d["windows_decision_us_median_of_medians"], d["windows_decision_us_p99_max"])
        verdict = f"median {'met' if median <= 50 else 'NOT met'}, p99 {'met' if p99 <= 500 else 'NOT met'}"
        wakes = ", ".join(f"{reason} {count:.1f}" for reason, count in d.get("wakes_per_step", {}).items())
        lines.append(f"| {label} | {profiled} | {windows} | {point} | {decider} | {d['progress_sources']} | "
                     f"{wakes or '-'} | {verdict} |")
    for label, d in rows.items():
        lead = d.get("lead_ins")
        if lead and lead["waits"]:
            late = "" if lead["late_ms_median_of_windows"] is None else \
                f" (by {lead['late_ms_median_of_windows']:.3f} ms, median, {lead['late_ms_p99_max']:.3f} ms worst p99)"
            lines.append(f"\n{label}: the thread slept through {lead['waits']} lead-ins; the GPU passed the step's "
                         f"first anchor after its expected time in {lead['late']}{late}, and never by the give-up time "
                         f"in {lead['missed']}.")
    return lines


def _step_lines(result: dict[str, Any]) -> list[str]:
    rows = {label: o["steps"] for label, o in result["overhead"].items() if o.get("steps")}
    if not rows:
        return []
    lines = ["", "## Where the overhead shows (host time at each step's hook; without / with the controller)", "",
             f"Median step: each window's median step interval. Long steps: the share of a window's time in steps "
             f"over {LONG_STEP:g}x its median. GC: the interpreter's garbage-collection passes per window "
             "(count, ms), generations 0 / 1 / 2. Training thread: its time on a CPU and waiting on a run queue "
             "(ms/step; 0 where the kernel keeps no schedstats), its voluntary context switches (it blocked: on a "
             "lock, the interpreter's included, or in a blocking call) and involuntary ones (preempted) per step.",
             "",
             "| workload | median step (ms) | overhead of median steps, mean of pairs [95% CI] | long steps | "
             "GC passes per window | GC ms per window | training thread: CPU / waiting / voluntary / involuntary |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for label, s in rows.items():
        low, high = s["median_step_pair_ci95"]
        arms = (s["without"], s["with"])
        gc_text, gc_ms = ([" / ".join(f"{a['gc_per_window'][g][i]:.1f}" for g in "012") for a in arms]
                          for i in (0, 1))
        lines.append(f"| {label} | {arms[0]['median_step_ms']:.2f} / {arms[1]['median_step_ms']:.2f} | "
                     f"{s['median_step_pair_mean']:+.2%} [{low:+.2%}, {high:+.2%}] | "
                     f"{arms[0]['long_step_share']:.1%} / {arms[1]['long_step_share']:.1%} | "
                     f"{gc_text[0]}; {gc_text[1]} | {gc_ms[0]}; {gc_ms[1]} | {_scheduling_text(arms)} |")
    for label, s in rows.items():
        lines += ["", f"{label}, per pair: overhead, steps controlled in its window"
                  + (", training thread's run-queue wait (ms/step), voluntary and involuntary switches per step, "
                     "without / with" if "waiting_s" in s["pairs"][0] else "") + ":"]
        lines += [f"- {p['overhead']:+.2%}, {p['controlled_steps']}" + (
            f", {1e3 * p['waiting_s'][0]:.2f} / {1e3 * p['waiting_s'][1]:.2f} ms, "
            f"{p['voluntary'][0]:.1f} / {p['voluntary'][1]:.1f}, {p['involuntary'][0]:.1f} / {p['involuntary'][1]:.1f}"
            if "waiting_s" in p else "") for p in s["pairs"]]
        if "blocked_share" in s["without"]:
            lines += ["", f"{label}, the training thread and the autograd engine's (which runs the backward pass "
                      "while the training thread waits for it), each sampled every 0.2 ms from another process "
                      "(`--sample-blocking`): share of its samples running or asleep in each system call (a futex "
                      "by the mapping its word lies in: the interpreter's lock in `python3.12`), without / with:"]
            lines += _share_lines(s["without"]["blocked_share"], s["with"]["blocked_share"])
    return lines


def _share_lines(without: dict[str, float], with_: dict[str, float]) -> list[str]:
    """One line per sampled thread: its shares without / with the controller, largest with first."""
    lines = []
    for thread in sorted({_thread_of(what) for what in {*without, *with_}}, key=lambda t: (t != "training", t)):
        keys = sorted((what for what in {*without, *with_} if _thread_of(what) == thread),
                      key=lambda what: -with_.get(what, 0.0))
        lines.append(f"- {thread}: " + ", ".join(
            f"{what.partition(': ')[2] or what} {without.get(what, 0.0):.1%} / {with_.get(what, 0.0):.1%}"
            for what in keys))
    return lines


def _scheduling_text(arms: tuple[dict[str, Any], dict[str, Any]]) -> str:
    """The training thread's CPU and run-queue wait (ms/step), voluntary and involuntary switches per step,
    without; with."""
    if "training_thread_per_step" not in arms[0]:
        return "-"
    return "; ".join(f"{1e3 * t['on_cpu_s']:.1f} / {1e3 * t['waiting_s']:.2f} / {t['voluntary']:.1f} / "
                     f"{t['involuntary']:.1f}"
                     for t in (a["training_thread_per_step"] for a in arms))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _verdict(value: float | None, limit: float) -> str:
    return "n/a" if value is None else ("met" if value <= limit else "NOT met")


def _interval_verdict(interval: list[float], limit: float) -> str:
    """``met`` when the whole 95% interval is within ``limit``, ``NOT met`` when it is all beyond it."""
    low, high = interval
    return "met" if high <= limit else "NOT met" if low > limit else "not shown (the interval holds it)"


def _end_to_end_line(cli: dict[str, Any] | None) -> str:
    if cli is None:
        return "- end-to-end: not run (`--no-end-to-end`)"
    return (f"- end-to-end: `{cli['command']}` ({cli['wall_s']:.0f} s): {cli['summary']['steps']} steps, "
            f"{cli['summary']['controlled_steps']} controlled, {cli['logged_requests']} requests logged; NVML calls: "
            f"{cli['nvml']}")


def _markdown(result: dict[str, Any]) -> str:
    run, lines = result["run"], ["# Clock controller on an NVIDIA H200, dry run only", ""]
    lines += [f"- command: `{result['command']}`",
              f"- machine: host `{run['machine']}`, Python {run['python']}, {run['started_utc']} to "
              f"{run.get('finished_utc', 'its time limit (cut short after the workloads below)')}; "
              f"GPU (nvidia-smi before): `{run['nvidia_smi_before']}`",
              _end_to_end_line(run.get("cli")), "",
              "## Overhead on step time (with / without the controller, same process, windows ABBA)", "",
              "| workload | without (ms/step) | with (ms/step) | overhead | mean of pairs [95% CI] | per pair | "
              "controller CPU (ms/step): thread (end waits, issuing, online part) / hooks / energy | "
              "steps controlled | target <= 1% |",
              "| --- | ---: | ---: | ---: | --- | --- | --- | ---: | --- |"]
    for label, o in result["overhead"].items():
        pairs = ", ".join(f"{p:+.2%}" for p in o["pair_overheads"])
        cpu = o.get("cpu_ms_per_step")
        cpu_text = "-" if cpu is None else \
            f"{cpu['thread']:.2f} ({_parts(cpu)}) / {cpu['hooks']:.2f} / {cpu['energy']:.2f}"
        share = "-" if cpu is None else f"{o['controlled_share']:.0%}"
        low, high = o["pair_ci95"]
        lines.append(f"| {label} | {o['step_time_without_ms']:.2f} | {o['step_time_with_ms']:.2f} | "
                     f"{o['overhead']:+.2%} | {o['pair_mean']:+.2%} [{low:+.2%}, {high:+.2%}] | {pairs} | "
                     f"{cpu_text} | {share} | {_interval_verdict(o['pair_ci95'], TARGETS['overhead'])} |")
    lines += arm_lines(result.get("arms", {}))
    lines += _step_lines(result)
    lines += ["", "## Timing error against the profiled kernel starts (planned minus actual)", "",
              "`switch_instants`: every request of the profiled controlled steps; of them `_in_step` (kernels after "
              "the first) and `_first_kernel` (the hand-over's change for a step's first kernel, planned at the "
              "previous step's expected end: the GPU starts that kernel after its idle gap between steps, so the "
              "change is in effect before it and the error is mostly that gap). `_first_kernel_gap`: the same "
              "changes against that gap (0 inside it, from the previous step's last kernel's end to the first "
              "kernel's start: the GPU runs nothing there, so any instant in it is that kernel boundary; else how "
              "far outside); `switch_instants_gap`: those and `_in_step`.", "",
              "| workload | what | count | median abs (ms) | p99 abs (ms) | max abs (ms) | median signed (ms) | "
              "targets (median <= 0.5, p99 <= 2 ms) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for label, t in result["timing"].items():
        for what in ("switch_instants", "switch_instants_in_step", "switch_instants_first_kernel",
                     "switch_instants_first_kernel_gap", "switch_instants_gap", "kernel_starts_anchored",
                     "kernel_starts", "step_ends_profiled", "step_ends_unprofiled"):
            if what not in t:  # results from before the split
                continue
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
        for key, what in (("requests", "profiled controlled steps"), ("requests_all_steps", "whole run")):
            r = t[key]
            if r["requests"]:
                lines.append(f"Requests ({what}): {r['requests']}, {r['anchored']} placed on an anchor; issued "
                             f"{r['lead_ms_median']:.2f} ms (median), {r['lead_ms_min']:.2f} ms (least) before their "
                             f"change, {r['issued_a_latency_ahead']} at least the {r['latency_ms']:.0f} ms latency "
                             f"ahead; the thread woke {_ms(r['anchor_wake_ms_median'])} (median), "
                             f"{_ms(r['anchor_wake_ms_max'])} (most) after the GPU passed the anchor.")
        lines += _pace_lines(t.get("pace", {"steps": 0}))
    lines += _decision_lines(result)
    return "\n".join(lines) + "\n" + result.get("notes", "")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _pace_lines(pace: dict[str, Any]) -> list[str]:
    """The stretches between anchors, live over planned time (``controller_timing.pace_figures``)."""
    if not pace["steps"]:
        return []
    median, least, most = (np.asarray(pace[key]) for key in ("median", "least", "most"))
    inner = median[1:-1]
    near = np.mean(np.abs(inner - 1) <= 0.01)
    return [f"Pace, live over planned time of each stretch between anchors (median over {pace['steps']} matched "
            f"steps [least, most]): the start to the first anchor {median[0]:.2f} [{least[0]:.2f}, {most[0]:.2f}] "
            f"(controlled steps {_ratio(pace['lead_in_median']['controlled'])}, at auto "
            f"{_ratio(pace['lead_in_median']['auto'])}); "
            f"anchor to anchor, medians {inner.min():.2f} to {inner.max():.2f} ({near:.0%} within 1% of 1); "
            f"the last anchor to the end {median[-1]:.2f} [{least[-1]:.2f}, {most[-1]:.2f}]; "
            f"the steps' scale {pace['scale_median']:.3f} (median)."]


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
    ran = run.get("command", "python benchmarks/controller_h200.py run DIR")
    result = {"command": f"{ran} (on the GPU machine), then python benchmarks/controller_h200.py report DIR",
              "run": run, "targets": TARGETS,
              "overhead": overhead,
              "arms": {label: {**a, "mean": statistics.mean(a["differences"]),
                               "ci95": list(mean_interval(a["differences"]))} for label, a in arms.items()},
              "timing": {d["label"]: timing_figures(folder, d, cpu_test) for d in children if d["profile"]},
              "decisions": {d["label"]: decision_figures(d) for d in children},
              "nvml_in_children": {d["label"]: d["nvml"] for d in children},
              "notes": DISCUSSION if name == "controller_h200" and not cpu_test else ""}
    write_results(name, result, _markdown(result), indent=1, folder=folder if cpu_test else RESULTS)
