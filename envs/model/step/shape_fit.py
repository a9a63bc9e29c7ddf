"""Per-kernel fits in the shape variables: each aligned kernel slot's number (duration, idle gap, FLOPs,
bytes) as a non-negative combination of basis functions of the step shape.

Bases (:func:`basis`), in the variables of the shapes (:class:`~kdvfs.envs.trace.shape.ShapeAxes`: the tokens
of each input whose length varies on its own, e.g. an encoder-decoder's input and label tokens, or each
micro-batch's tokens of a step with gradient accumulation): ``1`` and each variable for every kernel (GEMMs,
elementwise and norm kernels, optimizer and embedding kernels: their work grows with the tokens, or not at
all); attention kernels add each variable times each variable's length (``batch * seq^2``, the score matrix;
with two variables also the cross terms, ``batch * seq_dec * seq_enc`` of cross-attention). A step of one
sequence length has one variable, ``tokens`` (``batch * seq``); images have seq 1, so tokens is the batch. With
non-negative coefficients a slot's number never falls as the step grows and never goes below zero: extrapolation stays
sane. The non-negative least squares is solved exactly for every slot at once by enumerating the supports
(at most 2^p - 1 of them for p columns): the optimum is the least-squares solution on the best feasible support.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.envs.trace.shape import ShapeAxes, StepShape

TOKENS_UNIT = 1e3
"""Scale of the tokens column (conditioning only)."""
SCORES_UNIT = 1e6
"""Scale of the batch x seq^2 column (conditioning only)."""
MAX_CROSS_VARIABLES = 2
"""Most variables whose cross terms (each variable times another's length) attention kernels are fitted on."""
TIE = 1e-9
"""Relative residual improvement a larger support needs to replace a smaller one."""


def basis(shapes: Sequence[StepShape], quadratic: bool, axes: ShapeAxes | None = None) -> Array:
    """(n, p) columns ``1`` and each variable of ``axes`` (default: the axes of ``shapes``), and with
    ``quadratic`` each variable times each variable's length (own lengths only beyond
    ``MAX_CROSS_VARIABLES`` variables), in scaled units."""
    axes = axes or ShapeAxes.of(shapes)
    m = len(axes.variables)
    pairs = [(j, k) for j in range(m) for k in range(m) if j == k or m <= MAX_CROSS_VARIABLES]
    rows = []
    for shape in shapes:
        values, lengths = axes.values(shape), axes.length_values(shape)
        row = [1.0, *(v / TOKENS_UNIT for v in values)]
        if quadratic:
            row += [values[j] * lengths[k] / SCORES_UNIT for j, k in pairs
                    if axes.lengths[k] >= 0 and axes.lengths[j] >= 0]
        rows.append(row)
    width = 1 + m + (sum(axes.lengths[k] >= 0 and axes.lengths[j] >= 0 for j, k in pairs) if quadratic else 0)
    return np.array(rows, dtype=np.float64).reshape(len(shapes), width)


def fit_nonnegative(x: Array, y: Array, weights: Array) -> Array:
    """Non-negative least squares of every slot at once.

    Args:
        x: (n, p) basis at the n observed shapes.
        y: (n, S) each slot's value at each shape (anything where its weight is 0).
        weights: (n, S) each observation's weight (0: the slot is missing at that shape).

    Returns:
        (S, p) coefficients >= 0 minimising sum weights * (y - x c)^2; a slot without observations gets 0.
    """
    p = x.shape[1]
    slots = y.shape[1]
    y = np.where(weights > 0, y, 0.0)
    best = np.zeros((slots, p))
    best_residual = np.full(slots, np.inf)
    scale = np.maximum((weights * y * y).sum(axis=0), 1e-300)
    for size in range(1, p + 1):
        for support in combinations(range(p), size):
            columns = x[:, support]
            normal = np.einsum("nq,ns,nr->sqr", columns, weights, columns)
            rhs = np.einsum("nq,ns->sq", columns, weights * y)
            solvable = np.abs(np.linalg.det(normal)) > 1e-12 * np.maximum(
                np.einsum("sqq->s", normal) ** size, 1e-300)
            safe = np.where(solvable[:, None, None], normal, np.eye(size))
            coef = np.linalg.solve(safe, rhs[..., None])[..., 0]
            residual = (weights * (y - columns @ coef.T) ** 2).sum(axis=0)
            better = solvable & (coef >= 0).all(axis=1) & (residual < best_residual - TIE * scale)
            best[better] = 0.0
            best[np.ix_(better, support)] = coef[better]
            best_residual[better] = residual[better]
    return best

