"""Search on a sorted list without numpy (for the controller's decisions).

numpy's ``searchsorted`` releases the interpreter lock (GIL) whatever the size; a thread that releases it beside
a busy training loop can lose it until that loop lets go or the interpreter's switch interval (5 ms) forces it
(evidence: ``docs/results.md``). The controller's decisions search with this instead.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence


def index_right(sorted_values: Sequence[float] | Sequence[int], value: float) -> int:
    """``np.searchsorted(sorted_values, value, side="right")`` (on a list: ``Array.tolist()``)."""
    return bisect.bisect_right(sorted_values, value)
