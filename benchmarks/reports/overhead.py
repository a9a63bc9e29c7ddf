"""Figures of ``benchmarks/h200/overhead.py run`` (see that module) and their Markdown."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.common.provenance import RESULTS, provenance, provenance_lines, write_results
from kdvfs.runtime.controller.measurement.accounting import ran_as_intended
from kdvfs.runtime.controller.measurement.estimator import Paired
from kdvfs.runtime.device.update_clock import measured_s

TARGETS = {"slowdown_points": 0.3, "overhead_pct": 0.5, "host_cpu_pct": 2.0, "decision_us": 50.0,
           "late_ms": 0.2}
"""The dry run's controlled-vs-auto slowdown within +-0.3 points with an interval holding 0; the whole-run
overhead at most 0.5%; the controller's host CPU at most 2% of the step time; the decisions' median at most
50 us; the late requests' median lateness at most 0.2 ms."""
WARMUP_STEPS = 30
"""Steps of each process left out of its mean step time and CPU (CUDA's and kdvfs's start)."""


LAGS = (-1, 0, 1)
"""Update periods by which a power read is compared after the period whose mean power the counter gives."""


def power_vs_energy(probe: dict[str, Any]) -> dict[str, dict[str, dict[str, float | int | None]]]:
    """Each power field against the counter (``overhead.power_beside_energy``'s rows): the mean power of each update
    period (the counter's increment over the period, the median time between its changes) against the field
    read just after the period's end (lag 0), a period before (-1) or after (1): per field and lag the median
    relative difference (%), the correlation and the periods compared."""
    rows = probe["rows"]
    changes = [i for i in range(1, len(rows)) if rows[i][2] != rows[i - 1][2]]
    times_s = [measured_s(rows[i - 1], rows[i]) for i in changes]  # as the energy thread places a change
    gaps_s = [b - a for a, b in itertools.pairwise(times_s)]
    if not gaps_s:
        return {}
    period_s = statistics.median(gaps_s)
    means_w = {k: (rows[changes[k + 1]][2] - rows[changes[k]][2]) / period_s for k in range(len(gaps_s))
               if 0.5 * period_s < gaps_s[k] < 1.5 * period_s}
    result: dict[str, dict[str, dict[str, float | int | None]]] = {}
    for column, field in enumerate(probe["fields"], start=3):
        result[field] = {}
        for lag in LAGS:
            pairs = [(mean_w, rows[changes[k + 1 + lag]][column]) for k, mean_w in means_w.items()
                     if 0 <= k + 1 + lag < len(changes) and rows[changes[k + 1 + lag]][column] is not None]
            errors = [100 * (read_w / mean_w - 1) for mean_w, read_w in pairs if mean_w > 0]
            correlation = (statistics.correlation(*zip(*pairs, strict=True))
                           if len(pairs) > 2 and len({p[1] for p in pairs}) > 1 else None)
            result[field][str(lag)] = {"median_abs_diff_pct": statistics.median(map(abs, errors)) if errors else None,
                                       "correlation": correlation, "periods": len(pairs)}
    return result


def _interval(values: list[float]) -> dict[str, Any]:
    """Mean, 95% t interval and count of ``values`` (the A/B estimator's)."""
    paired = Paired()
    for value in values:
        paired.add(value)
    found = paired.interval()
    return {"mean": statistics.mean(values) if values else None, "ci95": None if found is None else
            [found.lo_pct, found.hi_pct], "n": len(values)}


def host_pace_arm(processes: list[dict[str, Any]]) -> dict[str, Any]:
    """How the controller's own host work moves the training loop's host pace in a dry run (the clocks do not
    change): each A/B pair's controlled window's mean host pace against its auto window's (%), both windows run as
    their arm says, pooled over the processes' pairs (mean and 95% t interval); ``n`` 0 where no process logged a
    pace (a run before the windows carried it)."""
    differences = []
    for process in processes:
        by_pair: dict[int, dict[str, float]] = {}
        for window in process.get("windows") or []:
            intended = ran_as_intended(window["arm"], window["steps"], window["controlled_steps"])
            if window.get("host_pace_s") is not None and window["pair"] is not None and intended:
                by_pair.setdefault(window["pair"], {})[window["arm"]] = window["host_pace_s"]
        differences += [100 * (pair["B"] / pair["A"] - 1) for pair in by_pair.values() if len(pair) == 2]
    return _interval(differences)


def _mean_step_s(process: dict[str, Any]) -> float:
    return statistics.mean(process["step_s"][WARMUP_STEPS:])


def _cpu_per_step_s(process: dict[str, Any]) -> float:
    cpu_s = process["cpu_s"]
    return (cpu_s[-1] - cpu_s[WARMUP_STEPS]) / (len(cpu_s) - 1 - WARMUP_STEPS)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def workload_figures(processes: list[dict[str, Any]]) -> dict[str, Any]:
    """One workload's figures from its processes (see ``overhead_h200``'s docstring)."""
    ran = [p for p in processes if p["exit_code"] == 0 and len(p["step_s"]) > WARMUP_STEPS + 1
           and (not p["with"] or p["summary"] is not None)]
    pairs = sorted({p["pair"] for p in ran})
    arm = {(p["pair"], p["with"]): p for p in ran}
    complete = [i for i in pairs if (i, True) in arm and (i, False) in arm]
    overheads = [100 * (_mean_step_s(arm[i, True]) / _mean_step_s(arm[i, False]) - 1) for i in complete]
    withs = [p for p in ran if p["with"]]
    summaries = [p["summary"] for p in withs]
    costs = [s["host_cost"] for s in summaries]
    onlines = [s["online"] for s in summaries if s.get("online")]
    requests = [s["requests"] for s in summaries]
    steps = sum(s["steps"] for s in summaries)
    cpu_pairs = [1e3 * (_cpu_per_step_s(arm[i, True]) - _cpu_per_step_s(arm[i, False])) for i in complete]
    without_ms = statistics.mean(1e3 * _mean_step_s(arm[i, False]) for i in complete) if complete else None
    return {
        "step_ms_without": without_ms,
        "step_ms_with": statistics.mean(1e3 * _mean_step_s(arm[i, True]) for i in complete) if complete else None,
        "overhead_pct": {**_interval(overheads), "pairs": overheads, "pair_ids": complete},
        "dry_run_slowdown_pct": {**_interval([x for p in withs for x in p["pairs_slowdown_pct"]]),
                                 "per_process": [s["measured"] for s in summaries]},
        "host_pace_arm_pct": host_pace_arm(withs),
        "controlled_share": sum(s["controlled_steps"] for s in summaries) / steps if steps else None,
        "host_cost": {key: statistics.mean(c[key] for c in costs)
                      if costs and all(c.get(key) is not None for c in costs) else None
                      for key in ("per_step_ms", "thread_per_step_ms", "step_share_pct", "thread_step_share_pct",
                                  "wakes_per_step", "training_step_share_pct")},
        "host_cost_parts_ms_per_step": {part: sum(c.get(part) or 0.0 for c in costs) / steps if steps else None
                                        for part in ("thread_ms", "energy_thread_ms", "hooks_ms", "server_ms")},
        "energy_learning_ms_per_step": _learning_ms_per_step(summaries, steps),
        "process_cpu_ms_per_step": {**_interval(cpu_pairs), "pairs": cpu_pairs},
        "energy_counter": [s["energy_counter"] for s in summaries],
        "decisions_us": {"median_of_processes": _median([o["decision_us"]["median"] for o in onlines]),
                         "p99_max": max((o["decision_us"]["p99"] or 0.0 for o in onlines), default=None)},
        "wakes_per_step": {reason: sum(o["wakes"].get(reason, 0) for o in onlines) / steps
                           for reason in sorted({r for o in onlines for r in o["wakes"]})} if steps else {},
        "timeline_wakes_per_step": sum(c["timeline_wakes"] for c in costs) / steps
        if steps and costs and all(c.get("timeline_wakes") is not None for c in costs) else None,
        "requests": {"planned": sum(r["planned"] for r in requests), "late": sum(r["late"] for r in requests),
                     "late_ms_median_of_processes": _median([r["late_ms"]["median"] for r in requests]),
                     "late_ms_p99_max": max((r["late_ms"]["p99"] or 0.0 for r in requests), default=None)},
        "nvml_refused": sum(sum((p.get("nvml") or {}).get("refused", {}).values()) for p in withs),
        "failed_processes": len(processes) - len(ran),
        "processes": [{k: v for k, v in p.items() if k not in ("step_s", "cpu_s")} for p in processes],
    }


OWN = " (own process)"
"""Suffix of a workload's arm whose controller ran in a process of its own (``kdvfs run``'s default outside
torchrun; the other arm ran ``--in-process``)."""


def arms(label: str, processes: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A workload's processes by arm: ``label`` (the controller in the training process) and, where run, ``label``
    + ``OWN``, each with the same pairs' processes without kdvfs."""
    without = [p for p in processes if not p["with"]]
    by_arm = {label: without + [p for p in processes if p["with"] and not p.get("own_process")]}
    own = [p for p in processes if p["with"] and p.get("own_process")]
    if own:
        by_arm[label + OWN] = without + own
    return by_arm


def own_process_difference(workloads: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per workload run both ways: the in-process overhead minus the own-process overhead, pair by pair (points;
    the two arms of a pair ran beside the same process without kdvfs), mean and 95% t interval."""
    differences = {}
    for label, figures in workloads.items():
        own = workloads.get(label + OWN)  # None for an own-process arm itself, or a workload run one way
        if own is None:
            continue
        theirs = dict(zip(own["overhead_pct"]["pair_ids"], own["overhead_pct"]["pairs"], strict=True))
        points = [mine - theirs[pair] for pair, mine in
                  zip(figures["overhead_pct"]["pair_ids"], figures["overhead_pct"]["pairs"], strict=True)
                  if pair in theirs]
        differences[label] = {**_interval(points), "pairs": points}
    return differences


def _learning_ms_per_step(summaries: list[dict[str, Any]], steps: int) -> float | None:
    """The energy thread's one-time learning of the counter's clock, per step (ms; None: not in every summary,
    whose runs predate it, or no steps)."""
    learned = [(s.get("energy_counter") or {}).get("calibration_cpu_s") for s in summaries]
    if not steps or any(cpu_s is None for cpu_s in learned):
        return None
    return 1e3 * sum(learned) / steps


def verdicts(figures: dict[str, Any]) -> dict[str, bool | None]:
    """Each target of ``TARGETS`` met (True), missed (False) or not measured (None) by one workload's figures."""
    slowdown, overhead = figures["dry_run_slowdown_pct"], figures["overhead_pct"]
    share = figures["host_cost"]["step_share_pct"]
    decision = figures["decisions_us"]["median_of_processes"]
    late = figures["requests"]["late_ms_median_of_processes"]
    return {
        "slowdown_points": None if slowdown["ci95"] is None else
        abs(slowdown["mean"]) <= TARGETS["slowdown_points"] and slowdown["ci95"][0] <= 0 <= slowdown["ci95"][1],
        "overhead_pct": None if overhead["mean"] is None else overhead["mean"] <= TARGETS["overhead_pct"],
        "host_cpu_pct": None if share is None else share <= TARGETS["host_cpu_pct"],
        "decision_us": None if decision is None else decision <= TARGETS["decision_us"],
        "late_ms": True if late is None else late <= TARGETS["late_ms"],
    }


def _pct(interval: dict[str, Any]) -> str:
    if interval["mean"] is None:
        return "-"
    ci = "" if interval["ci95"] is None else f" [{interval['ci95'][0]:+.2f}, {interval['ci95'][1]:+.2f}]"
    return f"{interval['mean']:+.2f}%{ci} (n={interval['n']})"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _thread_lines(result: dict[str, Any]) -> list[str]:
    """The controller's thread, decisions and requests, workload by workload."""
    lines = ["", "## The controller's thread, decisions and requests (targets: decisions' median <= 50 us; late "
              "requests' median lateness <= 0.2 ms)", "",
              "| workload | wakes per step (by reason, decision points; the timeline's looks) | decisions median / "
              "worst p99 (us) | "
              "requests planned ahead, late, lateness median / worst p99 (ms) | energy counter: reads, of them "
              "learning / re-measuring, update period (ms), read (ms) | NVML calls refused |",
              "| --- | --- | --- | --- | --- | --- |"]
    for label, f in result["workloads"].items():
        wakes = ", ".join(f"{r} {n:.1f}" for r, n in f["wakes_per_step"].items())
        if f.get("timeline_wakes_per_step") is not None:
            wakes += f"; timeline {f['timeline_wakes_per_step']:.1f}"
        req, dec = f["requests"], f["decisions_us"]
        energy = "; ".join(f"{e['reads']}, {e['calibration_reads']} / {e['relock_reads']}, "
                           f"{_num(e['update_period_ms'], 1)}, {_num(e['read_ms'])}"
                           for e in f["energy_counter"] if e)
        lines.append(f"| {label} | {_num(f['host_cost']['wakes_per_step'], 1)} ({wakes}) | "
                     f"{_num(dec['median_of_processes'], 1)} / {_num(dec['p99_max'], 1)} | "
                     f"{req['planned']}, {req['late']}, "
                     f"{_num(req['late_ms_median_of_processes'], 3)} / {_num(req['late_ms_p99_max'], 3)} | {energy} | "
                     f"{f['nvml_refused']} |")
    return lines


def _pace_and_arm_lines(result: dict[str, Any]) -> list[str]:
    """The host pace's arm effect and the in-process against own-process overheads (none where not measured)."""
    lines: list[str] = []
    paces = {label: f["host_pace_arm_pct"] for label, f in result["workloads"].items()
             if f.get("host_pace_arm_pct", {}).get("n")}
    if paces:
        lines += ["", "## The training loop's host pace, controlled windows against auto (`host_pace_arm`: the "
                  "controller's own host work; a dry run does not change the clocks)", ""]
        lines += [f"- {label}: {_pct(pace)} over the processes' A/B pairs" for label, pace in paces.items()]
    if result.get("own_process_difference"):
        lines += ["", "## In the training process or in its own (pair by pair: the two arms of a pair ran beside the "
                  "same process without kdvfs)", ""]
        lines += [f"- {label}: in-process overhead minus own-process overhead {_pct(d).replace('%', '')} points; "
                  f"pairs {', '.join(f'{x:+.2f}' for x in d['pairs'])}"
                  for label, d in result["own_process_difference"].items()]
    return lines


def _probe_lines(result: dict[str, Any]) -> list[str]:
    """The NVML reads' probe on this GPU (none where not run)."""
    lines: list[str] = []
    probe = result["run"].get("probe")
    if probe:
        lines += ["", "## NVML reads on this GPU (probe, through the guard)", "",
                  f"- total-energy read: {probe['energy']['read_wall_ms']:.3f} ms wall, "
                  f"{probe['energy']['read_cpu_ms']:.3f} ms of the reading thread's CPU (median of "
                  f"{probe['energy']['reads']}); the counter updated every "
                  f"{_num(probe['energy']['update_period_ms'], 1)} ms (median)",
                  f"- power read: {probe['power']['read_wall_ms']:.4f} ms wall, {probe['power']['read_cpu_ms']:.4f} ms "
                  f"CPU; updated every {_num(probe['power']['update_period_ms'], 1)} ms",
                  *_field_lines(probe.get("energy_field")),
                  f"- a pure-Python loop ran at {probe['gil']['ratio']:.3f} of its speed alone while another thread "
                  "read the energy counter back to back (near 1: the read does not hold the interpreter lock)"]
        if "rows" in probe.get("power_beside_energy", {}):
            beside = probe["power_beside_energy"]
            lines += _power_lines(power_vs_energy(beside), beside["load_phase_s"])
    return lines


def markdown(result: dict[str, Any]) -> str:
    """The results page."""
    gpu = result["run"]["nvidia_smi_before"].split(",")[0] or "GPU"
    lines = [f"# kdvfs's whole cost on an {gpu}, dry runs only", "", *provenance_lines(result), "",
             f"- run: `{result['run']['command']}` on `{result['run']['machine']}`, {result['run']['started_utc']}"
             f" to {result['run'].get('finished_utc', 'cut short')}; GPU (nvidia-smi before): "
             f"`{result['run']['nvidia_smi_before']}`",
             *([f"- policy: `{result['run']['policy']}`"] if result["run"].get("policy") else []),
             *([f"- `{OWN.strip()}`: the controller in a process of its own (`kdvfs run`, outside torchrun), a third "
                "process in each pair; the training process pays its hooks and the threads serving the controller "
                "(server: the native event poller; the shape server where steps vary)"]
               if result["run"].get("own_process") else []), "",
             "## Whole run and dry run (targets: overhead <= 0.5%; controlled-vs-auto slowdown within +-0.3 "
             "points, interval holding 0; host CPU <= 2% of the step)", "",
             "| workload | step without / with (ms) | overhead, mean of ABBA process pairs [95% CI] | dry run's "
             "controlled vs auto windows, pooled A/B pairs [95% CI] | controller host CPU: ms/step (% of step); "
             "of it thread / energy (its one-time clock learning) / hooks / server (poller) (ms/step); the training "
             "process's "
             "share | "
             "process CPU with - without (ms/step) | steps controlled |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for label, f in result["workloads"].items():
        cost, parts = f["host_cost"], f["host_cost_parts_ms_per_step"]
        lines.append(f"| {label} | {_num(f['step_ms_without'])} / {_num(f['step_ms_with'])} | "
                     f"{_pct(f['overhead_pct'])} | {_pct(f['dry_run_slowdown_pct'])} | "
                     f"{_num(cost['per_step_ms'])} ({_num(cost['step_share_pct'])}%); "
                     f"{_num(parts['thread_ms'])} / {_num(parts['energy_thread_ms'])} "
                     f"({_num(f.get('energy_learning_ms_per_step'))}) / {_num(parts['hooks_ms'])} / "
                     f"{_num(parts.get('server_ms'))}; "
                     f"{_num(cost.get('training_step_share_pct'))}% | "
                     f"{_pct(f['process_cpu_ms_per_step']).replace('%', '')} | "
                     f"{_num(100 * f['controlled_share'], 0)}% |")
    lines += [*_thread_lines(result), *_pace_and_arm_lines(result)]
    lines += ["", "## Targets", "", "| workload | " + " | ".join(TARGETS) + " |",
              "| --- |" + " --- |" * len(TARGETS)]
    for label, verdict in result["verdicts"].items():
        lines.append(f"| {label} | " + " | ".join("-" if v is None else ("met" if v else "MISSED")
                                                   for v in verdict.values()) + " |")
    lines += _probe_lines(result)
    return "\n".join(lines) + "\n"


def _field_lines(field: dict[str, Any] | None) -> list[str]:
    """The total-energy counter read through the field-value call (a probe older runs lack: no line)."""
    if field is None:
        return []
    if not field.get("given"):
        return [f"- total-energy read through the field-value call: not given by this driver "
                f"({field['read_wall_ms']:.4f} ms a refused call)"]
    return [f"- total-energy read through the field-value call: {field['read_wall_ms']:.4f} ms wall, "
            f"{field['read_cpu_ms']:.4f} ms CPU (median of {field['reads']}); updated every "
            f"{_num(field['update_period_ms'], 1)} ms"]


def _power_lines(compared: dict[str, dict[str, dict[str, Any]]], load_phase_s: float) -> list[str]:
    """The power fields against the counter's mean power of each update period, per lag (see
    :func:`power_vs_energy`)."""
    lines = [f"- power fields against the counter's mean power over each update period, under a load switching every "
             f"{load_phase_s:g} s (median relative difference, correlation, periods; lag: the field read "
             "that many periods after the period's end):"]
    for field, lags in compared.items():
        parts = [f"lag {lag}: {_num(f['median_abs_diff_pct'], 1)}%, r {_num(f['correlation'], 3)}, {f['periods']}"
                 for lag, f in lags.items()]
        lines.append(f"  - {field}: " + "; ".join(parts))
    return lines


def report(folder: Path, cpu_test: bool, name: str = "overhead_h200") -> None:
    """Write ``NAME.{md,json}`` (into ``folder`` for a CPU test, else ``benchmarks/results``)."""
    run = json.loads((folder / "run.json").read_text())
    workloads = {name: workload_figures(processes) for label in run["workloads"]
                 for name, processes in arms(label, [p for p in run["processes"] if p["label"] == label]).items()}
    result = {**provenance(f"{run['command']} (on the GPU machine), then python -m benchmarks.h200.overhead report "
                           f"DIR --name {name}"),
              "run": {k: v for k, v in run.items() if k != "processes"}, "targets": TARGETS,
              "warmup_steps": WARMUP_STEPS, "workloads": workloads,
              "own_process_difference": own_process_difference(workloads),
              "verdicts": {label: verdicts(f) for label, f in workloads.items()}}
    write_results(name, result, markdown(result), indent=1, folder=folder if cpu_test else RESULTS)
