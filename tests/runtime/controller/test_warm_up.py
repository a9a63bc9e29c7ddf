"""The thread's warm-ups: their lead and figures."""

from __future__ import annotations

import numpy as np

from kdvfs.envs.env.live import LiveState
from kdvfs.runtime.controller.warm_up import WARM_UPS, WarmUp


def test_the_lead_is_the_10th_percentile_of_the_recent_warm_ups_and_every_one_is_reported() -> None:
    states: list[LiveState] = []
    warm_up = WarmUp(states.append)
    assert warm_up.lead_s() == 0.0 and warm_up.figures() == {"warm_us": {"median": None, "p99": None},
                                                               "warm_ms": 0.0}
    for kernel in range(WARM_UPS + 36):
        warm_up.run(LiveState(kernel, 0, -1, 0.0, 0.0, 0.0))
    assert [s.kernel for s in states] == list(range(WARM_UPS + 36)) and len(warm_up.durations_us) == WARM_UPS + 36
    recent_s = np.array(warm_up.durations_us[-WARM_UPS:]) / 1e6
    assert warm_up.lead_s() == np.percentile(recent_s, 10)
    assert warm_up.figures()["warm_ms"] == 1e-3 * sum(warm_up.durations_us)
