"""The clocks that findings about a counter's updates allow (`UpdateSearch`)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from kdvfs.runtime.device.update_search import UpdateSearch

OFFSETS_S = st.floats(-0.02, 0.02).filter(lambda offset_s: abs(offset_s) >= 1e-9)
"""A probe's time from the update it asks about: never within a nanosecond of it (a host clock's resolution), where
the true clock would lie on the findings' boundaries and the polygon's float arithmetic may cut it off."""


@given(st.floats(0.0, 0.1), st.floats(0.05, 0.2), st.lists(st.tuples(st.integers(1, 30), OFFSETS_S),
                                                           min_size=1, max_size=20))
def test_findings_true_of_a_clock_keep_it_and_narrow_the_windows_around_its_updates(
        first_s: float, period_s: float, probes: list[tuple[int, float]]) -> None:
    """Each probe finds whether update n came by a time near it (as a read in its window would): the true
    clock stays in the polygon, every window holds the true update, and a window only narrows."""
    search = UpdateSearch((first_s - 0.01, first_s + 0.01), (period_s * 0.8, period_s * 1.2))
    for n, offset_s in probes:
        update_s, probe_s = first_s + n * period_s, first_s + n * period_s + offset_s
        before = search.window(n)
        search.cut(n, -math.inf, probe_s) if update_s <= probe_s else search.cut(n, probe_s, math.inf)
        assert not search.empty
        earliest_s, latest_s = search.window(n)
        assert earliest_s - 1e-9 <= update_s <= latest_s + 1e-9
        assert before[0] - 1e-9 <= earliest_s and latest_s <= before[1] + 1e-9
    center_s, center_period_s = search.center()
    assert search.window(0)[0] - 1e-9 <= center_s <= search.window(0)[1] + 1e-9
    assert period_s * 0.8 - 1e-9 <= center_period_s <= period_s * 1.2 + 1e-9


def test_findings_that_contradict_a_fixed_period_leave_no_clock() -> None:
    search = UpdateSearch((0.0, 0.01), (0.09, 0.11))
    search.cut(1, 0.105, math.inf)
    search.cut(2, -math.inf, 0.19)  # update 1 after 0.105 and update 2 by 0.19: a period under 0.085 after 0.105
    assert search.empty
