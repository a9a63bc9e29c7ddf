"""The Markdown report of ``benchmarks/h200/controller.py report``: overhead, arms, where the overhead shows,
timing error and online decisions, from the figures of ``benchmarks/reports/controller.py``."""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.reports.controller_arms import arm_lines


def markdown(result: dict[str, Any]) -> str:
    """The Markdown report of a result of ``benchmarks.reports.controller.report``."""
    lines = [*_overhead_lines(result), *arm_lines(result.get("arms", {})), *_step_lines(result),
             *_timing_lines(result), *_decision_lines(result)]
    return "\n".join(lines) + "\n" + result.get("notes", "")


def _overhead_lines(result: dict[str, Any]) -> list[str]:
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
                     f"{cpu_text} | {share} | {_interval_verdict(o['pair_ci95'], result['targets']['overhead'])} |")
    return lines


def _timing_lines(result: dict[str, Any]) -> list[str]:
    targets, lines = result["targets"], []
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
            met = "met" if e["median_abs_ms"] <= targets["median_ms"] and e["p99_abs_ms"] <= targets["p99_ms"] \
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
    return lines


def _step_lines(result: dict[str, Any]) -> list[str]:
    rows = {label: o["steps"] for label, o in result["overhead"].items() if o.get("steps")}
    if not rows:
        return []
    lines = ["", "## Where the overhead shows (host time at each step's hook; without / with the controller)", "",
             f"Median step: each window's median step interval. Long steps: the share of a window's time in steps "
             f"over {result.get('long_step', 1.5):g}x its median.", "",
             "| workload | median step (ms) | overhead of median steps, mean of pairs [95% CI] | long steps |",
             "| --- | --- | --- | --- |"]
    for label, s in rows.items():
        low, high = s["median_step_pair_ci95"]
        arms = (s["without"], s["with"])
        lines.append(f"| {label} | {arms[0]['median_step_ms']:.2f} / {arms[1]['median_step_ms']:.2f} | "
                     f"{s['median_step_pair_mean']:+.2%} [{low:+.2%}, {high:+.2%}] | "
                     f"{arms[0]['long_step_share']:.1%} / {arms[1]['long_step_share']:.1%} |")
    for label, s in rows.items():
        lines += ["", f"{label}, per pair: overhead, steps controlled in its window:"]
        lines += [f"- {p['overhead']:+.2%}, {p['controlled_steps']}" for p in s["pairs"]]
    return lines


def _decision_lines(result: dict[str, Any]) -> list[str]:
    rows = {label: d for label, d in result["decisions"].items()
            if d["decisions"] or d["windows_decision_us_median_of_medians"] is not None}
    if not rows:
        return []
    lines = ["", "## Online decisions on the controller's thread (wall time, from the wake, or from the end of its "
             "warm-up, to the request out)", "",
             "Profiled window: every policy evaluation in its log. Controlled windows: each window's summary "
             "(the median of their medians, the worst of their p99s). Every decision point: the whole point, "
             "with the next wake's scheduling. Warm-ups: the thread's throwaway decisions right before the points "
             "(`online_warm_up`).", "",
             "| workload | profiled window: evaluations, median / p99 (us) | controlled windows: median / worst p99 "
             "(us) | every decision point: median / worst p99 (us) | warm-ups: median / worst p99 (us), ms/step "
             "| progress from | wakes per step | targets (median <= 50, p99 <= 500 us) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [_decision_row(label, d) for label, d in rows.items()]
    for label, d in rows.items():
        lead = d.get("lead_ins")
        if lead and lead["waits"]:
            late = "" if lead["late_ms_median_of_windows"] is None else \
                f" (by {lead['late_ms_median_of_windows']:.3f} ms, median, {lead['late_ms_p99_max']:.3f} ms worst p99)"
            lines.append(f"\n{label}: the thread slept through {lead['waits']} lead-ins; the GPU passed the step's "
                         f"first anchor after its expected time in {lead['late']}{late}, and never by the give-up time "
                         f"in {lead['missed']}.")
    return lines


def _decision_row(label: str, d: dict[str, Any]) -> str:
    profiled = f"{d['decisions']}, {d['decision_us_median']:.1f} / {d['decision_us_p99']:.1f}" \
        if d["decisions"] else "-"
    windows = "-" if d["windows_decision_us_median_of_medians"] is None else \
        f"{d['windows_decision_us_median_of_medians']:.1f} / {d['windows_decision_us_p99_max']:.1f}"
    point = "-" if d["point_us_median_of_windows"] is None else \
        f"{d['point_us_median_of_windows']:.1f} / {d['point_us_p99_max_of_windows']:.1f}"
    warm = "-" if d.get("warm_us_median_of_windows") is None else \
        f"{d['warm_us_median_of_windows']:.1f} / {d['warm_us_p99_max_of_windows']:.1f}, {d['warm_ms_per_step']:.2f}"
    median, p99 = (d["decision_us_median"], d["decision_us_p99"]) if d["decisions"] else \
        (d["windows_decision_us_median_of_medians"], d["windows_decision_us_p99_max"])
    verdict = f"median {'met' if median <= 50 else 'NOT met'}, p99 {'met' if p99 <= 500 else 'NOT met'}"
    wakes = ", ".join(f"{reason} {count:.1f}" for reason, count in d.get("wakes_per_step", {}).items())
    return (f"| {label} | {profiled} | {windows} | {point} | {warm} | {d['progress_sources']} | "
            f"{wakes or '-'} | {verdict} |")


def _parts(cpu: dict[str, Any]) -> str:
    """The thread's CPU parts a step: waiting for the step ends, issuing, the online decisions (ms; - where not
    recorded)."""
    return ", ".join("-" if cpu.get(k) is None else f"{cpu[k]:.2f}" for k in ("end_wait", "issue", "online"))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


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
