"""numpy on small arrays without letting go of the interpreter lock (for the controller's decisions).

numpy releases the interpreter lock (GIL) in ``argmax``, ``searchsorted`` and ``take`` whatever their
size, in element-wise loops over more than 500 elements and in ``np.dot``. A thread that releases it
beside a busy training loop can lose it until that loop lets go or the interpreter's switch interval
(5 ms) forces it: the online controller's decisions use these instead (measured in
``benchmarks/results/online_decision_lock.md``). They give numpy's answer, ties to the first index.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from kdvfs.envs.model.cost_model import Array


def argmax(values: Array) -> int:
    """Index of the first maximum of the 1-D ``values`` without NaN (``np.argmax``)."""
    listed = values.tolist()
    return int(listed.index(max(listed)))


def argmax_rows(values: Array) -> Array:
    """(R,) index of the first maximum of each row of the 2-D ``values`` without NaN (``np.argmax(axis=1)``);
    without the lock's release for at most 500 entries: the entries before each row's first maximum."""
    return np.logical_and.accumulate(values != values.max(axis=1, keepdims=True), axis=1).sum(axis=1)


def index_right(sorted_values: Sequence[float] | Sequence[int], value: float) -> int:
    """``np.searchsorted(sorted_values, value, side="right")`` (on a list: ``Array.tolist()``)."""
    return bisect.bisect_right(sorted_values, value)
