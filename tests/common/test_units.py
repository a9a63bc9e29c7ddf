"""Units at the edges: a budget is checked once, as a fraction; a latency typed in ms becomes seconds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdvfs.common.units import MAX_BUDGET, MAX_LATENCY_MS, UnitError, checked_budget, checked_latency_s
from kdvfs.runtime.controller.config import ControllerConfig


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_budget_is_a_finite_fraction_up_to_the_largest(value: float) -> None:
    if math.isfinite(value) and 0 <= value <= MAX_BUDGET:
        assert checked_budget(value) == value
    else:
        with pytest.raises(UnitError):
            checked_budget(value)


@given(st.floats(min_value=0.0, max_value=MAX_LATENCY_MS))
def test_a_latency_in_ms_is_seconds_inside(latency_ms: float) -> None:
    assert checked_latency_s(latency_ms) == latency_ms / 1e3


def test_the_controllers_config_checks_its_budget_and_latency_as_the_cli_does() -> None:
    with pytest.raises(UnitError, match=r"did you mean 0\.05"):
        ControllerConfig.from_options("p", "t", budget=5.0)
    with pytest.raises(UnitError, match="outside"):
        ControllerConfig.from_options("p", "t", latency_ms=-1.0)
    config = ControllerConfig.from_options("p", "t", latency_ms=2.0, issue_early_ms=0.5, online_interval_ms=1.0)
    assert (config.latency_s, config.timing.issue_early_s, config.online.interval_s) == (0.002, 0.0005, 0.001)
