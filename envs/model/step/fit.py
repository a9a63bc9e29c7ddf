"""Per-kernel fits in the shape variables: each aligned kernel slot's number (duration, idle gap, FLOPs,
bytes) as a non-negative combination of basis functions of the step shape.

Bases (:func:`basis`): ``1`` and ``tokens`` (``batch * seq``) for every kernel (GEMMs, elementwise and norm
kernels, optimizer and embedding kernels: their work grows with the tokens, or not at all); attention kernels
add ``batch * seq^2`` (the score matrix). Images have seq 1, so tokens is the batch. With non-negative
coefficients a slot's number never falls as the step grows and never goes below zero: extrapolation stays
sane. The non-negative least squares is solved exactly for every slot at once by enumerating the supports
(at most 2^3 - 1 of them): the optimum is the least-squares solution on the best feasible support.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np

from kdvfs.envs.model.cost_model import Array
from kdvfs.envs.trace.shape import StepShape

TOKENS_UNIT = 1e3
"""Scale of the tokens column (conditioning only)."""
SCORES_UNIT = 1e6
"""Scale of the batch x seq^2 column (conditioning only)."""
TIE = 1e-9
"""Relative residual improvement a larger support needs to replace a smaller one."""


def basis(shapes: Sequence[StepShape], quadratic: bool) -> Array:
    """(n, 2) columns ``1, tokens`` or, ``quadratic``, (n, 3) with ``batch * seq^2`` (scaled units)."""
    rows = [[1.0, s.tokens / TOKENS_UNIT] + ([s.batch * s.seq**2 / SCORES_UNIT] if quadratic else [])
            for s in shapes]
    return np.array(rows, dtype=np.float64).reshape(len(shapes), 3 if quadratic else 2)


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

