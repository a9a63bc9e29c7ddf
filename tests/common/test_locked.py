"""The lock-keeping search gives numpy's answer."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kdvfs.common.locked import index_right


@given(st.lists(st.floats(-10, 10), max_size=30).map(sorted), st.floats(-12, 12))
def test_index_right_is_searchsorted_right(values: list[float], value: float) -> None:
    assert index_right(values, value) == int(np.searchsorted(np.asarray(values, dtype=float), value, side="right"))
