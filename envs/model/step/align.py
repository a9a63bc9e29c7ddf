"""Aligning the kernels of two steps of one model at different shapes.

Steps of one model at two shapes launch mostly the same kernel sequence; GEMM kernel names change with the
shape, a few kernels appear or vanish (split-K reductions, workspace memsets, a sort instead of a copy), and
an MoE step's expert loop launches as many kernels as experts received tokens. Kernels are therefore
compared by their *token* (phase, category, launching op name, kind), never their name alone, and two steps
are aligned by a common subsequence of their tokens of the highest score (``TOKEN_MATCH`` per pair, plus a
bonus for equal names and op dimensions): a kernel inserted or dropped in one step shifts nothing else. The
dynamic programme is compiled (numba, cached beside this file), O(K1 x K2): tens of milliseconds for two
3,000-kernel steps; beyond ``MAX_CELLS`` cells, kernels are paired by their token's occurrence index instead.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.compiled import compiled
from kdvfs.envs.trace.trace import Kernel, Trace

TOKEN_MATCH = 2
"""Alignment score of two kernels with equal tokens."""
"""A pair scores one more for equal kernel names and one more for equal trailing dimensions of its op's inputs
(weights' and features' sizes, which do not change with the shape): of two alignments as long, the one pairing
like with like wins (a split-K helper with a split-K helper, an MoE expert's up-projection with an
up-projection)."""
MAX_CELLS = 64_000_000
"""Largest K1 x K2 the dynamic programme aligns (a byte per cell of traceback); larger pairs by occurrence."""
Token = tuple[str, str, str, str]


def token(kernel: Kernel) -> Token:
    """What identifies a kernel across shapes: (phase, category, launching op name, kind)."""
    return (kernel.phase.value, kernel.category.value, kernel.op.name if kernel.op else "", kernel.kind.value)


def trailing_dims(kernel: Kernel) -> tuple[int, ...]:
    """The last dimension of each input of the kernel's op (empty without an op)."""
    return tuple(dims[-1] if dims else -1 for dims in kernel.op.input_dims) if kernel.op else ()


def token_ids(traces: Sequence[Trace]) -> list[Array]:
    """Each trace's kernels as (K, 3) int64 ids of their token, their name and their op's trailing dimensions,
    one numbering shared by all."""
    numbering: dict[Hashable, int] = {}
    return [np.array([[numbering.setdefault(token(k), len(numbering)), numbering.setdefault(k.name, len(numbering)),
                       numbering.setdefault(trailing_dims(k), len(numbering))] for k in trace.kernels],
                     dtype=np.int64).reshape(len(trace), 3) for trace in traces]


@compiled
def _pair_score(a: Array, b: Array, i: int, j: int) -> int:  # pragma: no cover - compiled
    return TOKEN_MATCH + (a[i, 1] == b[j, 1]) + (a[i, 2] == b[j, 2])


@compiled
def _lcs(a: Array, b: Array) -> Array:  # pragma: no cover - compiled
    n, m = len(a), len(b)
    score = np.zeros((n + 1, m + 1), dtype=np.int32)
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            best = max(score[i + 1, j], score[i, j + 1])
            if a[i, 0] == b[j, 0]:
                best = max(best, score[i + 1, j + 1] + _pair_score(a, b, i, j))
            score[i, j] = best
    match = np.full(n, -1, dtype=np.int64)
    i, j = 0, 0
    while i < n and j < m:
        if a[i, 0] == b[j, 0] and score[i, j] == score[i + 1, j + 1] + _pair_score(a, b, i, j):
            match[i] = j
            i += 1
            j += 1
        elif score[i + 1, j] >= score[i, j + 1]:
            i += 1
        else:
            j += 1
    return match


def _by_occurrence(a: Array, b: Array) -> Array:
    """The n-th kernel of each token in ``a`` paired with the n-th of that token in ``b`` (-1: none)."""
    positions: dict[int, list[int]] = {}
    for j, value in enumerate(b.tolist()):
        positions.setdefault(value, []).append(j)
    seen: dict[int, int] = {}
    match = np.full(len(a), -1, dtype=np.int64)
    for i, value in enumerate(a.tolist()):
        n = seen.get(value, 0)
        seen[value] = n + 1
        found = positions.get(value, [])
        if n < len(found):
            match[i] = found[n]
    return match


def align(a: Array, b: Array) -> Array:
    """(len(a),) for each kernel of ``a`` ((K, 2) ids of :func:`token_ids`), the index of its partner in ``b``
    (-1: none). Partners increase strictly (an alignment) and have equal tokens (module docstring)."""
    if len(a) * len(b) > MAX_CELLS:
        return _by_occurrence(a[:, 0], b[:, 0])
    return np.asarray(_lcs(np.ascontiguousarray(a), np.ascontiguousarray(b)))


def inverse(match: Array, size: int) -> Array:
    """The alignment the other way: (size,) for each kernel of ``b``, its partner in ``a`` (-1: none)."""
    back = np.full(size, -1, dtype=np.int64)
    paired = np.flatnonzero(match >= 0)
    back[match[paired]] = paired
    return back


def slots(expected: Trace, executed: Trace) -> Array:
    """(len(executed),) for each kernel of ``executed``, the kernel of ``expected`` that stands for it: its
    partner (:func:`align`), else the partner of the nearest paired kernel before it, else ``expected``'s
    first kernel. How a controller expecting ``expected`` meets ``executed``, kernel by kernel."""
    expected_ids, executed_ids = token_ids([expected, executed])
    partner = inverse(align(expected_ids, executed_ids), len(executed))
    paired = np.flatnonzero(partner >= 0)
    if not len(paired):
        return np.zeros(len(executed), dtype=np.int64)
    before = np.searchsorted(paired, np.arange(len(executed)), side="right") - 1
    return np.where(partner >= 0, partner, np.where(before >= 0, partner[paired[np.maximum(before, 0)]], 0))
