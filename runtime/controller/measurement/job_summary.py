"""One summary for a torchrun job from its ranks' summaries and A/B windows: energy summed, time the max.

Every rank's controller reduces each step over the job (:func:`kdvfs.runtime.job.job_step`), so the ranks'
windows are the same steps in the same arms and pairs; only their joules differ. The job's figures:

* per A/B pair, joules per step summed over the ranks (``1 - sum J_B / sum J_A``), seconds per step the
  slowest rank's (``max s_B / max s_A - 1``), with the same paired t-interval as one GPU's
  (:mod:`kdvfs.runtime.controller.measurement.estimator`); a pair counts when every rank measured its energy;
  steps that vary (windows with ``kernel_steps``): the adjusted estimate over the job's windows, ranks' joules
  summed against their kernel times summed, seconds the slowest rank's against the largest kernel time;
* joules per step (all windows, auto, controlled) summed over the ranks, step time the slowest rank's;
* steps and controlled steps the fewest of any rank, clock requests summed, back-offs and mismatches the
  most of any rank, ``gpu_restored`` only when every rank's GPU is, the first rank's error;
* ``predicted``: the slowest rank's slowdown, the ranks' mean saving (ranks of equal energy), their ranges alike;
  ``ranks``: each rank's own row (``rank``, ``gpu_index`` and its figures).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Any

from kdvfs.runtime.controller.measurement.ab import AUTO
from kdvfs.runtime.controller.measurement.estimator import (
    Interval,
    Paired,
    WindowRow,
    adjusted,
    mean_by_position,
    measured,
    net,
)
from kdvfs.runtime.controller.model.run_summary import JobSummary, Predicted, RankRow, RunSummary


def _total(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else float(sum(v for v in values if v is not None))


def _adjusted(windows: list[list[dict[str, Any]]]) -> tuple[Interval | None, Interval | None]:
    """The job's adjusted saving and slowdown over the windows every rank ran as intended (steps that vary)."""
    by_steps: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for rank_windows in windows:
        for window in rank_windows:
            by_steps[(window["first_step"], window["last_step"])].append(window)
    energy_rows, time_rows = [], []
    for job_windows in by_steps.values():
        if len(job_windows) != len(windows) or not all(w["as_intended"] for w in job_windows):
            continue
        first = job_windows[0]
        controlled, mid_s = first["arm"] != AUTO, (first["start_s"] + first["end_s"]) / 2
        new_inputs = mean_by_position([w["new_inputs"] or () for w in job_windows])
        time_rows.append(WindowRow(controlled, max(w["step_time_s"] for w in job_windows),
                                   max(w["kernel_steps"] for w in job_windows), new_inputs, mid_s))
        energy_j = _total([w["energy_j_per_step"] for w in job_windows])
        if energy_j is not None:
            energy_rows.append(WindowRow(controlled, energy_j, sum(w["kernel_steps"] for w in job_windows),
                                         new_inputs, mid_s))
    return adjusted(energy_rows, -1.0), adjusted(time_rows, 1.0)


def _pairs(windows: list[list[dict[str, Any]]]) -> tuple[Paired, Paired, int, int]:
    """The job's paired saving and slowdown, and its windows at auto and controlled."""
    by_pair: dict[int, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for rank_windows in windows:
        for window in rank_windows:
            if window["pair"] is not None and window["as_intended"]:
                by_pair[window["pair"]][window["arm"]].append(window)
    saved, slowdown = Paired(), Paired()
    for pair in sorted(by_pair):
        arms = by_pair[pair]
        if len(arms) != 2 or any(len(arms[arm]) != len(windows) for arm in arms):
            continue
        auto, controlled = arms[AUTO], next(arms[arm] for arm in arms if arm != AUTO)
        slowdown.add((max(w["step_time_s"] for w in controlled) / max(w["step_time_s"] for w in auto) - 1) * 100)
        energy_auto, energy_controlled = (_total([w["energy_j_per_step"] for w in ws]) for ws in (auto, controlled))
        if energy_auto and energy_controlled is not None:
            saved.add((1 - energy_controlled / energy_auto) * 100)
    first = windows[0]
    auto_windows = sum(w["arm"] == AUTO and w["as_intended"] for w in first)
    return saved, slowdown, auto_windows, sum(w["controlled_steps"] == w["steps"] for w in first)


def _first(summaries: list[RunSummary], texts: list[str | None]) -> str | None:
    return next((f"rank {s.rank}: {text}" for s, text in zip(summaries, texts, strict=True) if text), None)


def _job_range(ranges: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The job's predicted range from its ranks' (one model, so their errors taken as moving together): the
    saving's ends averaged as the saving is, the slowdown's the largest as the slowdown is."""
    known = [r for r in ranges if r is not None]
    if len(known) < len(ranges) or not known:
        return None
    saved = [r["energy_saved_pct"] for r in known]
    slowdown = [r["slowdown_pct"] for r in known]
    return {**known[0], "energy_saved_pct": [sum(s[end] for s in saved) / len(saved) for end in (0, 1)],
            "slowdown_pct": [max(s[end] for s in slowdown) for end in (0, 1)]}


def _job_predicted(predicted: list[Predicted]) -> Predicted:
    return replace(predicted[0], slowdown_pct=max(p.slowdown_pct for p in predicted),
                   energy_saved_pct=sum(p.energy_saved_pct for p in predicted) / len(predicted),
                   switches=sum(p.switches for p in predicted), range=_job_range([p.range for p in predicted]))


def job_summary(summaries: list[RunSummary], windows: list[list[dict[str, Any]]]) -> JobSummary:
    """The job's summary (see the module docstring); one rank's summary as it is, with its ``ranks`` row."""
    ranks: list[RankRow] = [RankRow.of(s) for s in summaries]
    if len(summaries) == 1:
        return JobSummary(summaries[0], list(ranks))
    saved, slowdown, auto_windows, controlled_windows = _pairs(windows)
    varying = any(w.get("kernel_steps") is not None for rank_windows in windows for w in rank_windows)
    saved_interval, slowdown_interval = _adjusted(windows) if varying else (saved.interval(), slowdown.interval())
    effect = measured(saved_interval, slowdown_interval, auto_windows, controlled_windows)
    share = min(s.measured_net.controlled_share for s in summaries)
    step_times = [s.step_time_s for s in summaries]
    job = replace(
        summaries[0], rank=None, gpu_index=None,
        energy_j_per_step=_total([s.energy_j_per_step for s in summaries]),
        energy_j_per_step_auto=_total([s.energy_j_per_step_auto for s in summaries]),
        energy_j_per_step_controlled=_total([s.energy_j_per_step_controlled for s in summaries]),
        switches=sum(s.switches for s in summaries),
        steps=min(s.steps for s in summaries), controlled_steps=min(s.controlled_steps for s in summaries),
        mismatches=max(s.mismatches for s in summaries), backed_off=any(s.backed_off for s in summaries),
        guard_backoffs=max(s.guard_backoffs for s in summaries),
        backoff_reason=_first(summaries, [s.backoff_reason for s in summaries]) or "",
        error=_first(summaries, [s.error for s in summaries]),
        restore_error=_first(summaries, [s.restore_error for s in summaries]),
        observe_only=_first(summaries, [s.observe_only for s in summaries]),
        gpu_restored=all(s.gpu_restored for s in summaries),
        step_time_s=None if None in step_times else max(t for t in step_times if t is not None),
        measured=effect, measured_net=net(effect, share), predicted=_job_predicted([s.predicted for s in summaries]))
    return JobSummary(job, list(ranks))
