"""What a varying run's A/B interval is up against, from its dry run's log records (issue 53): the windows' noise
after the estimator's regression and the least half-width it allows (:func:`energy_floor`), the covariates' forms
(:func:`new_input_covariates`), how the arm moves the host's pace (:func:`host_pace_arm`), long steps and the
steps during background solves; :mod:`benchmarks.h200.varying_recipes` reports them beside each recipe's run."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from kdvfs.runtime.controller.measurement.accounting import ran_as_intended
from kdvfs.runtime.controller.measurement.estimator import WindowRow, adjusted, design, t_975

TARGET_HALF_WIDTH_PCT = 2.0
"""Issue 53's target for a varying run's dry-run saving interval (points either side)."""
LONG_STEP_FACTOR = 1.6
"""A step whose GPU time exceeds this many times the run's median is a long step (report: ``long_steps``)."""


def _as_intended(window: dict[str, Any]) -> bool:
    """Every step of a window's log record ran as its arm says (:func:`ran_as_intended`)."""
    return ran_as_intended(window["arm"], window["steps"], window["controlled_steps"])


def _row(window: dict[str, Any], value: float, new_inputs: tuple[float, ...] | None = None,
         paced: bool = False) -> WindowRow:
    """The estimator's row of a window's log record: its arm, ``value``, its covariates (``new_inputs``: another form
    of the new-input counts than the run's; ``paced``: with the record's host pace)."""
    return WindowRow(window["arm"] == "B", value, window["kernel_steps"],
                     tuple(window["new_inputs"]) if new_inputs is None else new_inputs,
                     (window["start_s"] + window["end_s"]) / 2, window.get("host_pace_s") if paced else None)


def _measured(windows: list[dict[str, Any]], energies: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
    """Each window run as its arm says whose joules per step were measured, with them."""
    joules = {e["last_step"]: e["energy_j_per_step"] for e in energies}
    return [(w, joules[w["last_step"]]) for w in windows if joules.get(w["last_step"]) is not None and _as_intended(w)]


def _residual_pct(rows: list[WindowRow]) -> tuple[float, int]:
    """What of the rows' figure the A/B estimator's regression (:func:`design`) leaves: its residual's standard
    deviation as a share of the mean (%), and the regression's columns."""
    x, y = design(rows)
    residual = y - x @ np.linalg.lstsq(x, y, rcond=None)[0]
    return float(100 * residual.std(ddof=x.shape[1]) / y.mean()), x.shape[1]


def window_noise(windows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the A/B interval of a varying run is up against, from its windows' records: the range of their steps' mean
    count of inputs of a shape new to the process (all positions together), the correlation of a window's step time with
    its expected kernel time, and the residual of its step time after the A/B estimator's own regression
    (:func:`design`: arm, expected kernel time, new inputs, time), as a share of the mean (%). None under 6 windows."""
    if len(windows) < 6:
        return None
    rows = [_row(w, w["step_time_s"]) for w in windows]
    totals = [sum(r.new_inputs) for r in rows]
    return {"new_inputs": [min(totals), max(totals)],
            "step_time_vs_kernel_correlation": float(np.corrcoef([r.value for r in rows],
                                                                 [r.kernel_steps for r in rows])[0, 1]),
            "adjusted_residual_pct": _residual_pct(rows)[0]}


def energy_floor(windows: list[dict[str, Any]], energies: list[dict[str, Any]], steps: int) -> dict[str, Any] | None:
    """The least saving half-width this run's windows could give at their noise: the joules per step of every window
    run as its arm says, regressed as the A/B estimator regresses them (:func:`design`), leave a residual (% of the
    mean, ``residual_pct``); an estimate from as many windows with the arms half and half, by ordinary least squares
    (no robust widening), would have a half-width of ``t(0.975, n - p) x residual x sqrt(4 / n)``
    (``floor_half_width_pct``), and ``TARGET_HALF_WIDTH_PCT`` would take ``steps`` times the square of their ratio
    (``steps_for_target``). A lower bound for the run's own estimator (a quarter of the windows at auto, HC3); None
    under 8 windows."""
    rows = [_row(w, joules) for w, joules in _measured(windows, energies)]
    if len(rows) < 8:
        return None
    residual_pct, columns = _residual_pct(rows)
    floor_pct = t_975(len(rows) - columns) * residual_pct * math.sqrt(4 / len(rows))
    return {"windows": len(rows), "residual_pct": residual_pct, "floor_half_width_pct": floor_pct,
            "steps_for_target": math.ceil(steps * (floor_pct / TARGET_HALF_WIDTH_PCT) ** 2)}


def new_input_covariates(windows: list[dict[str, Any]], energies: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The dry run's saving (%, with its interval) from its windows' records, once with each form of the covariates:
    ``run`` (the run's: the steps' mean count of calls with a new input shape at each input position),
    ``host_pace`` (the same and the windows' host pace, a diagnostic: what of the interval is the host's jitter;
    not the run's, as the pace would take in the controller's own host work, docs/design/controller.md),
    ``count`` (the counts summed over the positions) and ``share`` (the share of steps with any new input, the
    first form), on the same windows and joules; the same estimator (:func:`adjusted`) as the run's. None for a
    log without the share or without an estimate."""
    rows = [(w, joules) for w, joules in _measured(windows, energies) if w.get("new_input_steps") is not None]
    result = {}
    forms: dict[str, tuple[Callable[[dict[str, Any]], tuple[float, ...]], bool]] = {
        "run": (lambda w: tuple(w["new_inputs"]), False), "host_pace": (lambda w: tuple(w["new_inputs"]), True),
        "count": (lambda w: (sum(w["new_inputs"]),), False), "share": (lambda w: (w["new_input_steps"],), False)}
    for name, (covariate, paced) in forms.items():
        saving = adjusted([_row(w, joules, covariate(w), paced) for w, joules in rows], -1.0)
        if saving is None:
            return None
        result[name] = {"saving_pct": saving.mean_pct, "ci95_pct": [saving.lo_pct, saving.hi_pct],
                        "half_width_pct": saving.half_width_pct}
    return result


def host_pace_arm(windows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How the arm moves the windows' host pace (%, with its interval; :func:`adjusted` with the pace as the figure,
    the run's covariates): in a dry run the clocks do not change, so what moves it is the controller's own host work
    in controlled windows, which keeps the pace out of the run's estimate (docs/design/controller.md). None for a
    log without paces or without an estimate."""
    rows = [w for w in windows if w.get("host_pace_s") is not None and _as_intended(w)]
    effect = adjusted([_row(w, w["host_pace_s"]) for w in rows], 1.0) if rows else None
    if effect is None:
        return None
    paces_s = np.array([w["host_pace_s"] for w in rows])
    return {"effect_pct": effect.mean_pct, "ci95_pct": [effect.lo_pct, effect.hi_pct],
            "mean_s": float(paces_s.mean()), "cv_pct": float(100 * paces_s.std() / paces_s.mean())}


def long_steps(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The steps of a dry run's log whose GPU time exceeds ``LONG_STEP_FACTOR`` times its median: how many, which,
    and their median time against the run's (s); set beside the buckets planned in the background
    (:func:`during_solves`)."""
    times = {s["step"]: s["duration_s"] for s in steps if s.get("duration_s") is not None}
    median_s = statistics.median(times.values()) if times else None
    long = {} if median_s is None else {i: t for i, t in times.items() if t > LONG_STEP_FACTOR * median_s}
    return {"count": len(long), "steps": sorted(long), "median_s": median_s,
            "long_median_s": statistics.median(long.values()) if long else None}


def during_solves(steps: list[dict[str, Any]], planned: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Whether the workers' background solves slow the training steps down: the median GPU time (s) of the steps
    whose span (from the previous step's end to their own) overlaps a solve (``bucket_planned``: from its end less
    its ``solve_s`` to its end), against the other steps'. The same steps' shapes differ, so it is a first look,
    not a measurement of the cost. None without a solve logged (a log before ``solve_s``) or a step on each side."""
    solves = [(p["end_s"] - p["solve_s"], p["end_s"]) for p in planned if "solve_s" in p]
    ends = sorted((s["end_s"], s["duration_s"]) for s in steps if s.get("duration_s") is not None)
    overlapping, others = [], []
    for (start_s, _), (end_s, duration_s) in itertools.pairwise(ends):
        hit = any(a < end_s and b > start_s for a, b in solves)
        (overlapping if hit else others).append(duration_s)
    if not solves or not overlapping or not others:
        return None
    return {"solves": len(solves), "solve_s_median": statistics.median(b - a for a, b in solves),
            "steps_during": len(overlapping), "median_s_during": statistics.median(overlapping),
            "steps_other": len(others), "median_s_other": statistics.median(others)}


def steps_for_half_width(steps: int, half_width_pct: float | None) -> int | None:
    """The steps a run like this one (``steps`` long, its saving interval ``half_width_pct`` points either side)
    would take for a half-width of ``TARGET_HALF_WIDTH_PCT`` at the same noise and A/B share: the half-width falls
    as one over the root of the windows. An upper estimate: the t quantile shrinks too, and in a longer run fewer
    steps bring a shape new to the process."""
    if half_width_pct is None:
        return None
    return math.ceil(steps * (half_width_pct / TARGET_HALF_WIDTH_PCT) ** 2)
