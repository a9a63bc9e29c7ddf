"""The online policy's budget from the run's measured slowdown (:func:`fed_back_budget`; see
docs/design/controller.md, "Online decisions", "budget")."""

from __future__ import annotations

import numpy as np

from kdvfs.runtime.controller.measurement.estimator import Interval

MIN_FEEDBACK_PAIRS = 3
"""A/B pairs the measured slowdown needs before it moves the policy's budget."""
FEEDBACK_GAIN = 2.0
"""Budget points the policy's budget moves per point of measured slowdown under (over) the job's budget: at
higher gains the loop oscillates between no budget and twice the budget, at lower ones it does not leave the
budget's plan (tuned on the fake GPU; ``docs/results.md``)."""


def fed_back_budget(budget: float, job_budget: float, measured: Interval | None) -> float:
    """The policy's budget for the next steps (fraction of auto's step time): ``budget`` (the step's, with a
    rank's slack) moved by ``FEEDBACK_GAIN`` times how far the run's measured slowdown ``measured`` (%) is from
    ``job_budget`` (fraction) beyond one standard error, clipped to [0, 2 x ``budget``]; ``budget`` itself
    within a standard error of the job's budget, or with fewer than ``MIN_FEEDBACK_PAIRS`` pairs (or none)."""
    if measured is None or measured.n < MIN_FEEDBACK_PAIRS:
        return budget
    mean, spread = measured.mean, measured.standard_error
    if mean + spread < job_budget:  # under the budget by more than a standard error: spend more
        error = job_budget - (mean + spread)
    elif mean - spread > job_budget:  # over it by more than a standard error: spend less
        error = job_budget - (mean - spread)
    else:  # within a standard error of it: the run's budget
        error = 0.0
    return float(np.clip(budget + FEEDBACK_GAIN * error, 0.0, 2 * budget))
