"""The policy's step budget from the run's measured slowdown (:func:`step_budget`; see
:mod:`kdvfs.runtime.controller.online`, "budget")."""

from __future__ import annotations

import numpy as np

from kdvfs.runtime.controller.estimator import Interval

MIN_FEEDBACK_PAIRS = 3
"""A/B pairs the measured slowdown needs before it moves the step budget."""
FEEDBACK_GAIN = 2.0
"""Budget points the policy's step budget moves per point of measured slowdown under (over) the budget. Chosen
in exploratory fake-GPU runs (``benchmarks/online_fake_gpu.py``'s ``run`` with seeds 100-103 and 20 s; not
kept as a results file; the benchmark itself uses seeds 0-19), before the dead band: at 4 the loop
oscillated on B200 GPT-2 small (the step budget swung between 0 and twice the budget, 6x the switches,
1.76% saved against the replayed plan's 2.18%), at 1 it never moved off the budget's plan (2.18%), at 2 it
saved 2.22%; on H200 GPT-2 small all three were within 0.05 points (1.55-1.59% against 1.54%). With the
dead band, on the same seeds: 2.36% (B200 GPT-2 small), 2.12% against 2.07% (B200 BERT-base), 1.59%
against 1.54% (H200 GPT-2 small)."""


def step_budget(budget: float, target: float, measured: Interval | None) -> float:
    """The policy's budget for the next steps (fraction): ``budget`` (the step's, with a rank's slack) moved by
    ``FEEDBACK_GAIN`` times how far the run's measured slowdown ``measured`` (%) is from ``target`` (the
    job's budget, fraction) beyond one standard error, clipped to [0, 2 x ``budget``]; ``budget`` itself
    within a standard error of the target, or with fewer than ``MIN_FEEDBACK_PAIRS`` pairs (or none)."""
    if measured is None or measured.n < MIN_FEEDBACK_PAIRS:
        return budget
    mean, spread = measured.mean_pct / 100, measured.standard_error_pct / 100
    if mean + spread < target:  # under the budget by more than a standard error: spend more
        error = target - (mean + spread)
    elif mean - spread > target:  # over it by more than a standard error: spend less
        error = target - (mean - spread)
    else:  # within a standard error of it: the run's budget
        error = 0.0
    return float(np.clip(budget + FEEDBACK_GAIN * error, 0.0, 2 * budget))
