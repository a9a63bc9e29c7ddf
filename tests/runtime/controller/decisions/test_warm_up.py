"""The thread's warm-ups: their lead and figures."""

from __future__ import annotations

import time

import pytest

from kdvfs.runtime.controller.decisions.warm_up import WARM_UPS, WarmUp
from kdvfs.runtime.controller.model.run_summary import Quantiles


def test_the_lead_is_the_shortest_recent_warm_up_and_every_one_is_reported() -> None:
    calls: list[int] = []

    def rehearse(kernel: int) -> None:  # the first 36 at once, the last WARM_UPS after 0.1 ms
        calls.append(kernel)
        if len(calls) > 36:
            time.sleep(1e-4)

    warm_up = WarmUp()
    assert warm_up.lead_s() == 0.0 and warm_up.figures() == (Quantiles(None, None), 0.0)
    for kernel in range(WARM_UPS + 36):
        warm_up.run(lambda kernel=kernel: rehearse(kernel))
    assert calls == list(range(WARM_UPS + 36)) and len(warm_up.durations_us) == WARM_UPS + 36
    assert warm_up.lead_s() * 1e6 == pytest.approx(min(warm_up.durations_us[-WARM_UPS:])) and warm_up.lead_s() >= 1e-4
    assert warm_up.figures()[1] == 1e-3 * sum(warm_up.durations_us)
