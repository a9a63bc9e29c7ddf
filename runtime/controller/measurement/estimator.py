"""The paired estimate of what control does: energy saved and slowdown (%) with 95% intervals.

Each pair is one window at auto ("A") and the adjacent window under the policy ("B"), in a random order
(:mod:`kdvfs.runtime.controller.measurement.ab`). Its differences ``1 - J_B / J_A`` (joules per step) and
``s_B / s_A - 1`` (seconds per step) are nearly free of the GPU's drift; over the pairs the estimate is their
mean with a Student-t interval, ``mean +- t(0.975, n - 1) * sd / sqrt(n)``. Steps that vary
(:func:`adjusted`): one regression over every window on the arm, the shapes' covariates and the time (and, as a
diagnostic, the host pace), the effect the arm's coefficient, its interval robust to windows of unequal noise
(HC3). Fewer than ``MIN_PAIRS`` pairs give no interval (None). Why a t-interval and not a bootstrap:
docs/design/controller.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from kdvfs.common.units import PCT_PER_FRACTION
from kdvfs.runtime.controller.model.run_summary import Measured, NetEffect

MIN_PAIRS = 2
NEW_INPUT_COLUMNS = 3
"""The most input positions whose counts of new shapes enter :func:`design` (those that vary most): a model whose
inputs vary apart would otherwise spend a degree of freedom on each."""


def t_975(dof: int) -> float:
    """Student's t 0.975 quantile on ``dof`` (>= 1) degrees of freedom: ``scipy.stats.t.ppf(0.975, dof)``'s value,
    from the function it calls (``scipy.special.stdtrit``) without its general path (a new A/B pair computes it
    on the controller's thread, holding the interpreter lock)."""
    return float(special.stdtrit(dof, 0.975))


@dataclass(frozen=True)
class Interval:
    """A mean (%) with its 95% interval (%) over ``n`` pairs, and the mean's standard error (%)."""

    mean_pct: float
    lo_pct: float
    hi_pct: float
    n: int
    standard_error_pct: float

    @property
    def half_width_pct(self) -> float:
        return (self.hi_pct - self.lo_pct) / 2

    @property
    def mean(self) -> float:
        """The mean as a fraction, as budgets are (0.01 = 1%)."""
        return self.mean_pct / PCT_PER_FRACTION

    @property
    def lo(self) -> float:
        """The interval's low end as a fraction."""
        return self.lo_pct / PCT_PER_FRACTION

    @property
    def hi(self) -> float:
        """The interval's high end as a fraction."""
        return self.hi_pct / PCT_PER_FRACTION

    @property
    def standard_error(self) -> float:
        """The mean's standard error as a fraction."""
        return self.standard_error_pct / PCT_PER_FRACTION


class Paired:
    """Running mean and 95% Student-t interval of paired differences (%), updated one pair at a time."""

    def __init__(self) -> None:
        self.n, self._mean, self._m2 = 0, 0.0, 0.0

    def add(self, value_pct: float) -> None:
        """One more pair's difference (Welford's update)."""
        self.n += 1
        delta = value_pct - self._mean
        self._mean += delta / self.n
        self._m2 += delta * (value_pct - self._mean)

    def interval(self) -> Interval | None:
        """The mean and its interval (None before two pairs)."""
        if self.n < MIN_PAIRS:
            return None
        standard_error = math.sqrt(self._m2 / (self.n - 1) / self.n)
        half = t_975(self.n - 1) * standard_error
        return Interval(self._mean, self._mean - half, self._mean + half, self.n, standard_error)


def measured(saved: Interval | None, slow: Interval | None, windows_auto: int, windows_controlled: int) -> Measured:
    """The summary's ``measured`` figures: the effect while controlling."""
    return Measured(None if saved is None else saved.mean_pct, None if saved is None else [saved.lo_pct, saved.hi_pct],
                    None if slow is None else slow.mean_pct, None if slow is None else [slow.lo_pct, slow.hi_pct],
                    windows_auto, windows_controlled)


def net(figures: Measured, controlled_share: float) -> NetEffect:
    """The effect over the whole run, against a run entirely at auto: the effect while controlling times the
    share of steps that were controlled (auto windows, uncontrolled and settling steps save nothing)."""
    def scaled(value: float | None) -> float | None:
        return None if value is None else float(value) * controlled_share

    def scaled_bounds(bounds: list[float] | None) -> list[float] | None:
        return None if bounds is None else [v * controlled_share for v in bounds]

    return NetEffect(scaled(figures.energy_saved_pct), scaled_bounds(figures.energy_saved_ci95_pct),
                     scaled(figures.slowdown_pct), scaled_bounds(figures.slowdown_ci95_pct), controlled_share)


@dataclass(frozen=True)
class WindowRow:
    """One window for :func:`adjusted`: its arm, its per-step figure (seconds or joules per step) and what
    explains that figure besides the arm: its steps' mean expected kernel time in reference steps, for each
    forward-call input position their mean count of calls whose input there had a shape new to the process (each
    pays one-time host set-up), its middle (host s, for the drift) and its steps' mean host pace (s; None: not
    known)."""

    controlled: bool
    value: float
    kernel_steps: float
    new_inputs: tuple[float, ...]
    mid_s: float
    host_pace_s: float | None = None


def _by_position(rows: Sequence[Sequence[float]]) -> list[tuple[float, ...]]:
    """Each position's values over ``rows``, in their order (a row without that position counts 0)."""
    width = max((len(row) for row in rows), default=0)
    return [tuple(row[i] if i < len(row) else 0.0 for row in rows) for i in range(width)]


def mean_by_position(rows: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """Each position's mean over ``rows`` (a row without that position counts 0); () without rows."""
    return tuple(math.fsum(column) / len(rows) for column in _by_position(rows))


def design(rows: list[WindowRow]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`adjusted`'s regression: the design matrix (a column of ones, the arm, then each of the expected kernel
    time, the counts of new inputs of up to ``NEW_INPUT_COLUMNS`` positions (those of the largest variance over
    ``rows`` first), the window's middle and the host pace, centred, in that order, where it varies over ``rows``
    enough to be estimated) and the figures. A covariate is left out where it would leave the design short of full
    rank (say, two positions whose inputs always share a shape) or let one window alone fix a coefficient (leverage
    1: say, a count of new inputs that differs in one window only); the host pace (measured while the window runs,
    unlike the others) also where the arm moves it (:func:`arm_moves`): a host that waits on the GPU keeps the
    pace of its clocks, and the pace would then absorb the arm's effect. The rule looks at the covariates only,
    never at the figures."""
    columns = [[1.0] * len(rows), [float(r.controlled) for r in rows]]
    for values in ([r.kernel_steps for r in rows], *_new_input_columns(rows), [r.mid_s for r in rows]):
        columns = _with_column(columns, values)
    paces_s = [r.host_pace_s for r in rows]
    if all(p is not None for p in paces_s):
        known_s = [float(p) for p in paces_s if p is not None]
        if not arm_moves(np.array(columns).T, np.array(known_s)):
            columns = _with_column(columns, known_s)
    return np.array(columns).T, np.array([r.value for r in rows])


def _with_column(columns: list[list[float]], values: list[float]) -> list[list[float]]:
    """``columns`` and ``values`` centred, where they vary and the design stays estimable; else ``columns``."""
    if max(values) - min(values) <= 1e-12 * max(1.0, abs(max(values))):
        return columns
    centre = math.fsum(values) / len(values)
    candidate = [*columns, [v - centre for v in values]]
    return candidate if _estimable(np.array(candidate).T) else columns


def arm_moves(x: np.ndarray, covariate: np.ndarray) -> bool:
    """Whether the arm (``x``'s second column) moves ``covariate``: the 95% interval of the arm's coefficient in
    ``covariate`` regressed on ``x`` (the interval of :func:`adjusted`: HC3, Student-t on n - p) leaves out 0. A
    design that cannot be estimated counts as moved."""
    fit = _arm_fit(x, covariate)
    return fit is None or abs(fit[0]) > t_975(x.shape[0] - x.shape[1]) * fit[1]


def _arm_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float] | None:
    """The arm's coefficient (``x``'s second column) in ``y`` regressed on ``x``, its HC3 standard error and the
    mean fitted ``y`` without the arm; None where ``x`` cannot be estimated."""
    if not _estimable(x):
        return None
    inverse = np.linalg.inv(x.T @ x)
    beta = inverse @ x.T @ y
    leverage = np.einsum("ij,jk,ik->i", x, inverse, x)
    arm_row = inverse[1] @ x.T  # the arm's coefficient is arm_row @ y
    inflated = (y - x @ beta) / (1 - leverage)
    at_auto = float(np.mean(np.delete(x, 1, axis=1) @ np.delete(beta, 1)))
    return float(beta[1]), math.sqrt(float(np.sum((arm_row * inflated) ** 2))), at_auto


def _new_input_columns(rows: list[WindowRow]) -> list[list[float]]:
    """The windows' counts of new inputs by position (a window without a position counts 0), each distinct column
    once (inputs that always share a shape, such as token ids and their labels, give one), the
    ``NEW_INPUT_COLUMNS`` of the largest variance first."""
    columns = dict.fromkeys(_by_position([r.new_inputs for r in rows]))
    return [list(c) for c in sorted(columns, key=lambda column: -float(np.var(column)))[:NEW_INPUT_COLUMNS]]


def _estimable(x: np.ndarray) -> bool:
    """Whether design ``x`` has full column rank, a degree of freedom left and no window of leverage 1."""
    if x.shape[0] <= x.shape[1] or np.linalg.matrix_rank(x) < x.shape[1]:
        return False
    return float(np.einsum("ij,jk,ik->i", x, np.linalg.inv(x.T @ x), x).max()) < 1 - 1e-9


def adjusted(rows: list[WindowRow], sign: float = 1.0) -> Interval | None:
    """The arm's effect (%) on windows of mixed steps, adjusted for what differs between them (ANCOVA).

    The per-step figure of every window of both arms is regressed (ordinary least squares) on the arm, the
    window's expected kernel time per step, its counts of new inputs per step by position, its time (the drift)
    and, where the rows carry it, its host pace (how fast the training loop's host ran: on a shared host most of
    what a window's steps take beyond their kernels; the run's rows do not carry it, docs/design/controller.md);
    covariates that do not vary are left out. The effect is the arm's coefficient
    over the mean fitted figure at auto, times 100 (times ``sign``: -1 for a saving), with a Student-t 95%
    interval on ``n - p`` degrees of freedom around the heteroscedasticity-robust standard error HC3 (each
    window's residual over ``1 - leverage``): windows do not share one noise (a window of new inputs or long
    steps is noisier, and it weighs more when it is rare), which the pooled residual variance assumes. The
    covariates but the host pace are known before the window runs (the shapes), so the adjustment removes the
    shape mix from the comparison without absorbing the arm's effect; the host pace is measured as it runs, and
    enters only where the arm does not move it (:func:`design`). ``n`` of the interval is the smaller arm's
    window count. None with fewer than two windows of each arm, too few windows for the regression, or a window
    that alone fixes a coefficient (leverage 1).
    """
    controlled = sum(r.controlled for r in rows)
    if controlled < MIN_PAIRS or len(rows) - controlled < MIN_PAIRS:
        return None
    x, y = design(rows)
    fit = _arm_fit(x, y)
    if fit is None or fit[2] <= 0:
        return None
    arm, arm_error, at_auto = fit
    scale = 100.0 * sign / at_auto
    standard_error = arm_error * abs(scale)
    mean = arm * scale
    half = t_975(len(rows) - x.shape[1]) * standard_error
    return Interval(mean, mean - half, mean + half, min(controlled, len(rows) - controlled), standard_error)
