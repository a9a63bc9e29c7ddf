"""The lock-keeping numpy helpers give numpy's answers (ties to the first index)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from kdvfs.envs.common.locked import argmax, argmax_rows, index_right

FINITE = st.floats(-1e3, 1e3, width=32) | st.sampled_from([0.0, 1.0, -np.inf])


@given(arrays(np.float32, st.integers(1, 40), elements=FINITE))
def test_argmax_is_numpys(values: np.ndarray) -> None:
    assert argmax(values) == int(np.argmax(values))


@given(arrays(np.float32, st.tuples(st.integers(1, 5), st.integers(1, 60)), elements=FINITE))
def test_argmax_rows_is_numpys(values: np.ndarray) -> None:
    assert np.array_equal(argmax_rows(values), np.argmax(values, axis=1))


@given(st.lists(st.floats(-10, 10), max_size=30).map(sorted), st.floats(-12, 12))
def test_index_right_is_searchsorted_right(values: list[float], value: float) -> None:
    assert index_right(values, value) == int(np.searchsorted(np.asarray(values, dtype=float), value, side="right"))
