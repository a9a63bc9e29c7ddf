"""Per-kernel fits in the shape variables: each aligned kernel slot's number (duration, idle gap, FLOPs,
bytes) as a non-negative combination of basis functions of the step shape.

Bases (:func:`basis`), in the variables of the shapes (:class:`~kdvfs.envs.trace.shape.ShapeAxes`: the tokens
of each input whose length varies on its own, e.g. an encoder-decoder's input and label tokens, or each
micro-batch's tokens under gradient accumulation), by :class:`Terms`. Linear columns: ``1`` and each variable.
Quadratic columns add each variable times its own length (``batch * seq^2``, the score matrix) and, with two
variables, one cross term (``batch * seq_enc * seq_dec``). Images have seq 1, so tokens is the batch. Attention
kernels add an odd-length score column per variable of both parities in the captures (:func:`odd_lengths`).

:func:`choose_terms` picks the basis the captured shapes determine: with :data:`SPARE_SHAPES` beyond the quadratic
columns every kernel gets them (score-sized work also runs outside fused attention kernels: eager attention's
GEMMs and softmax, a position bias, a mask); with fewer, attention kernels only; below them none; then the
step's size, then a constant. A fit is never underdetermined. :func:`required_shapes` is what a capture takes so
that a fit with one shape left out keeps the richest basis. Non-negative coefficients: a slot's number never
falls as the step grows nor goes below zero. The non-negative least squares is solved exactly for every slot at
once by enumerating the supports (at most 2^p - 1 for p columns): the least-squares solution on the best feasible
support; a support with a cross term (one variable's tokens times another's length) only where it lowers the
AICc (:func:`fit_nonnegative`). Design: ``docs/design/step-model.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from itertools import combinations

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.envs.trace.shape import ShapeAxes, StepShape

TOKENS_UNIT = 1e3
"""Scale of the tokens column (conditioning only)."""
SCORES_UNIT = 1e6
"""Scale of the batch x seq^2 column (conditioning only)."""
MAX_CROSS_VARIABLES = 2
"""Most variables whose cross terms (each variable times another's length) the quadratic columns hold."""
SPARE_SHAPES = 2
"""Shapes beyond its columns the quadratic basis needs before every kernel is fitted on it: a fit with a residual
to spare, not an interpolation of the captures' noise."""
TIE = 1e-9
"""Relative residual improvement a larger support needs to replace a smaller one."""
RESIDUAL_FLOOR = 1e-12
"""Least residual, relative to the slot's sum of squares, that a support's AICc counts (:func:`fit_nonnegative`):
an exact fit is not infinitely better than one within rounding."""


class Terms(StrEnum):
    """Which columns a step model's kernels are fitted on (module docstring), richest first."""

    QUADRATIC = "quadratic"
    """Every kernel: linear and quadratic columns."""
    ATTENTION = "attention"
    """Attention kernels: linear and quadratic columns; every other kernel: linear columns."""
    LINEAR = "linear"
    """Every kernel: ``1`` and each variable."""
    SIZE = "size"
    """Every kernel: ``1`` and the step's size (the sum of its variables)."""
    CONSTANT = "constant"
    """Every kernel: ``1`` (one captured shape)."""


def basis(shapes: Sequence[StepShape], attention: bool, axes: ShapeAxes | None = None,
          terms: Terms = Terms.ATTENTION, odd: Sequence[int] = ()) -> Array:
    """(n, p) the columns of ``terms`` at ``shapes`` for an attention kernel (``attention``) or any other, in the
    variables of ``axes`` (default: the axes of ``shapes``), in scaled units (module docstring); an attention
    kernel's quadratic columns end with the odd-length score column of each variable of ``odd``
    (:func:`odd_lengths`)."""
    axes = axes or ShapeAxes.of(shapes)
    quadratic = _quadratic(terms, attention)
    pairs = _pairs(axes) if quadratic else []
    odd = odd if quadratic and attention else ()
    rows = []
    for shape in shapes:
        values, lengths = axes.values(shape), axes.length_values(shape)
        if terms is Terms.CONSTANT:
            rows.append([1.0])
            continue
        if terms is Terms.SIZE:
            rows.append([1.0, sum(values) / TOKENS_UNIT])
            continue
        rows.append([1.0, *(v / TOKENS_UNIT for v in values),
                     *(values[j] * lengths[k] / SCORES_UNIT for j, k in pairs),
                     *(values[j] * lengths[j] * (lengths[j] % 2) / SCORES_UNIT for j in odd)])
    return np.array(rows, dtype=np.float64).reshape(len(shapes), columns(axes, terms, attention, odd))


def _quadratic(terms: Terms, attention: bool) -> bool:
    """Whether a kernel (an attention kernel: ``attention``) gets the quadratic columns on ``terms``."""
    return terms is Terms.QUADRATIC or (terms is Terms.ATTENTION and attention)


def _pairs(axes: ShapeAxes) -> list[tuple[int, int]]:
    """The (variable, length) products of the quadratic columns: each variable's own length, and one cross term
    per pair of variables (``values[j] * lengths[k]``, j < k) with up to ``MAX_CROSS_VARIABLES`` of them (with one
    batch, ``values[k] * lengths[j]`` is the same column); variables of one-dimensional inputs have none."""
    m = len(axes.variables)
    return [(j, k) for j in range(m) for k in range(j, m) if (j == k or m <= MAX_CROSS_VARIABLES)
            and axes.lengths[j] >= 0 and axes.lengths[k] >= 0]


def cross_columns(axes: ShapeAxes, terms: Terms, attention: bool = True, odd: Sequence[int] = ()) -> tuple[bool, ...]:
    """For each column of :func:`basis`, in its order, whether it is a cross term (``values[j] * lengths[k]``,
    j != k: a column of two variables)."""
    quadratic = _quadratic(terms, attention)
    width = columns(axes, terms, attention, odd)
    if not quadratic:
        return (False,) * width
    m = len(axes.variables)
    crossed = [j != k for j, k in _pairs(axes)]
    return (False,) * (1 + m) + tuple(crossed) + (False,) * (width - 1 - m - len(crossed))


def columns(axes: ShapeAxes, terms: Terms, attention: bool = True, odd: Sequence[int] = ()) -> int:
    """The number of columns of :func:`basis` for ``axes``, ``terms`` and ``odd`` (an attention kernel's with
    ``attention``: the most a model of those terms fits)."""
    if terms is Terms.CONSTANT:
        return 1
    if terms is Terms.SIZE:
        return 2
    quadratic = _quadratic(terms, attention)
    return 1 + len(axes.variables) + ((len(_pairs(axes)) + len(odd if attention else ())) if quadratic else 0)


def odd_lengths(shapes: Sequence[StepShape], axes: ShapeAxes, terms: Terms) -> tuple[int, ...]:
    """The variables (indices into ``axes.variables``) whose attention kernels get an odd-length score column
    (``values[j] * lengths[j]`` where the length is odd, 0 where even): those with a length that is odd at some
    of the distinct ``shapes`` and even at others, on a basis with quadratic attention columns, when the shapes
    determine the wider attention basis (at least its columns, independent). Why: cuDNN's fused attention with an
    additive mask (Hugging Face's SDPA path for padded and packed batches) runs its forward longer per score on a
    row of odd length than on an even one (H100 captures of the padded and packed decoder recipes; a mask row
    that is not 4-byte aligned is the guess, not checked); a smooth column cannot follow that, an indicator of the
    length's parity can. Empty otherwise."""
    if terms not in (Terms.QUADRATIC, Terms.ATTENTION):
        return ()
    distinct = list(dict.fromkeys(shapes))
    parities = [{axes.length_values(s)[j] % 2 for s in distinct} for j in range(len(axes.variables))]
    odd = tuple(j for j, seen in enumerate(parities) if axes.lengths[j] >= 0 and seen == {0, 1})
    width = columns(axes, terms, True, odd)
    if odd and (len(distinct) < width or np.linalg.matrix_rank(basis(distinct, True, axes, terms, odd)) < width):
        return ()
    return odd


def choose_terms(shapes: Sequence[StepShape], axes: ShapeAxes) -> Terms:
    """The richest :class:`Terms` the captured ``shapes`` determine: :attr:`Terms.QUADRATIC` with
    ``SPARE_SHAPES`` shapes beyond its columns, any other with at least its columns; in each case with columns
    independent at ``shapes`` (rank)."""
    distinct = list(dict.fromkeys(shapes))
    for terms in Terms:
        width = columns(axes, terms)
        needed = width + (SPARE_SHAPES if terms is Terms.QUADRATIC else 0)
        if len(distinct) >= needed and np.linalg.matrix_rank(basis(distinct, True, axes, terms)) == width:
            return terms
    return Terms.CONSTANT


def required_shapes(axes: ShapeAxes) -> int:
    """How many shapes a capture of steps with these ``axes`` takes: the quadratic basis's columns plus
    ``SPARE_SHAPES``, plus one, so that the step model keeps that basis with any one shape left out (its
    leave-one-out error measures the model the runtime fits). One varying length: 6; two: 9."""
    return columns(axes, Terms.QUADRATIC) + SPARE_SHAPES + 1


def fit_nonnegative(x: Array, y: Array, weights: Array, cross: Sequence[bool] = ()) -> Array:
    """Non-negative least squares of every slot at once.

    Each slot's fit is the least-squares solution on its feasible support (columns with non-zero coefficients)
    of least residual, but for one with a cross term (``cross``: :func:`cross_columns`): that is chosen only if
    its AICc (:func:`aicc`) is lower than that of the least-residual support without one. A kernel of one
    micro-batch (or one input) that follows its own variable alone otherwise takes a cross term for the part of
    the captures' noise it fits, and a shape where both variables are large (the corner of the captured range)
    extrapolates it (measured: ``docs/design/step-model.md``). A fit with no cross column, e.g. of one variable, is
    the least-residual one.

    Args:
        x: (n, p) basis at the n observed shapes.
        y: (n, S) each slot's value at each shape (anything where its weight is 0).
        weights: (n, S) each observation's weight (0: the slot is missing at that shape).
        cross: for each of the p columns, whether it is a cross term (empty: none is).

    Returns:
        (S, p) coefficients >= 0 of each slot's chosen support (minimising sum weights * (y - x c)^2 on it); a
        slot without observations gets 0.
    """
    p = x.shape[1]
    slots = y.shape[1]
    crossed = np.zeros(p, dtype=bool)
    crossed[: len(cross)] = cross
    y = np.where(weights > 0, y, 0.0)
    # index 0: the supports without a cross term; 1: those with one
    best = np.zeros((2, slots, p))
    best_residual = np.full((2, slots), np.inf)
    best_size = np.zeros((2, slots), dtype=np.int64)
    scale = np.maximum((weights * y * y).sum(axis=0), 1e-300)
    for size in range(1, p + 1):
        for support in combinations(range(p), size):
            kind = int(crossed[list(support)].any())
            columns = x[:, support]
            normal = np.einsum("nq,ns,nr->sqr", columns, weights, columns)
            rhs = np.einsum("nq,ns->sq", columns, weights * y)
            solvable = np.abs(np.linalg.det(normal)) > 1e-12 * np.maximum(
                np.einsum("sqq->s", normal) ** size, 1e-300)
            safe = np.where(solvable[:, None, None], normal, np.eye(size))
            coef = np.linalg.solve(safe, rhs[..., None])[..., 0]
            residual = (weights * (y - columns @ coef.T) ** 2).sum(axis=0)
            better = solvable & (coef >= 0).all(axis=1) & (residual < best_residual[kind] - TIE * scale)
            best[kind, better] = 0.0
            best[kind][np.ix_(better, support)] = coef[better]
            best_residual[kind, better] = residual[better]
            best_size[kind, better] = size
    if not crossed.any():
        return best[0]
    observed = (weights > 0).sum(axis=0)
    plain, with_cross = (aicc(best_residual[k], scale, observed, best_size[k]) for k in (0, 1))
    take = np.isfinite(best_residual[1]) & ((with_cross < plain) | ~np.isfinite(best_residual[0]))
    return np.where(take[:, None], best[1], best[0])


def aicc(residual: Array, scale: Array, n: Array, k: Array) -> Array:
    """The corrected Akaike information criterion of least-squares fits with ``k`` coefficients to ``n``
    observations: ``n log(RSS / n) + 2k + 2k(k + 1) / (n - k - 1)``, the residual ``RSS`` at least
    ``RESIDUAL_FLOOR`` of ``scale`` (the sum of squares fitted); infinite where ``n <= k + 1`` or the residual is
    (no fit)."""
    fitted = np.isfinite(residual) & (n > k + 1)
    rss = np.maximum(np.where(fitted, residual, 1.0), RESIDUAL_FLOOR * scale)
    n, spare = np.maximum(n, 1), np.where(fitted, n - k - 1, 1)
    return np.where(fitted, n * np.log(rss / n) + 2 * k + 2 * k * (k + 1) / spare, np.inf)
