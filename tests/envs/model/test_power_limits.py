"""The power limit a step was recorded under apart from the one it is priced at."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kdvfs.envs.gpu.profiles import Power, load_profile
from kdvfs.envs.model.cost_tables import CostTables, auto_step_pricer, build_tables
from kdvfs.envs.model.power_limits import PROFILE_DEFAULT, REQUESTED, TRACE, PowerLimitError, power_limits
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.trace import Category, Trace

H200 = load_profile("h200")
GEMM_HEAVY = open_trace("h200/gpt3xl-1layer-b4")


def recorded_under(trace: Trace, limit_w: float | None, range_w: tuple[float, float] | None = None,
                   gpu: str | None = None) -> Trace:
    meta = replace(trace.meta, power_limit_w=limit_w, power_limit_range_w=range_w, gpu=gpu or trace.meta.gpu)
    return replace(trace, meta=meta)


def auto_step(tables: CostTables) -> tuple[float, float]:
    """Step time (s) and average power (W) in auto mode at the highest memory clock."""
    time_s = tables.auto_time_s[:, 0].sum() + tables.gap_s.sum()
    energy_j = tables.auto_energy_j[:, 0].sum() + (tables.gap_s * tables.auto_gap_power_w[:, 0]).sum()
    return float(time_s), float(energy_j / time_s)


def assert_same_tables(left: CostTables, right: CostTables) -> None:
    for name in CostTables.__dataclass_fields__:
        assert np.array_equal(getattr(left, name), getattr(right, name)), name


def test_a_lower_priced_limit_slows_the_recorded_gemms_and_lowers_power() -> None:
    recorded, capped = build_tables(GEMM_HEAVY, H200), build_tables(GEMM_HEAVY, H200, power_limit_w=400.0)
    (time_s, power_w), (capped_s, capped_w) = auto_step(recorded), auto_step(capped)
    assert capped_s > time_s * 1.05 and capped_w < power_w - 100.0 and capped_w <= 400.0 + 1e-6
    gemm = np.array([k.category is Category.GEMM for k in GEMM_HEAVY.kernels])
    assert (capped.auto_time_s[gemm, 0] > recorded.auto_time_s[gemm, 0]).all()
    assert capped.auto_core_mhz[gemm, 0].max() < recorded.auto_core_mhz[gemm, 0].min()
    top = H200.clock_pairs_mhz[:, 0] == H200.clocks.max_core_mhz
    assert (capped.power_w[gemm][:, top] <= recorded.power_w[gemm][:, top] + 1e-9).all()


def test_pricing_at_the_recorded_limit_reproduces_the_tables_exactly() -> None:
    today = build_tables(GEMM_HEAVY, H200)
    assert_same_tables(today, build_tables(GEMM_HEAVY, H200, power_limit_w=H200.power.limit_w))
    own = recorded_under(GEMM_HEAVY, H200.power.limit_w, H200.power.limit_range_w)
    assert_same_tables(today, build_tables(own, H200))


def test_the_trace_limit_is_the_one_recorded_under_and_priced_at_by_default() -> None:
    lowered = replace(H200, power=Power(400.0, H200.power.limit_range_w, H200.power.idle_w))
    assert_same_tables(build_tables(GEMM_HEAVY, lowered), build_tables(recorded_under(GEMM_HEAVY, 400.0), H200))
    caps = power_limits(recorded_under(GEMM_HEAVY, 400.0, (150.0, 700.0)), H200)
    assert (caps.recorded_w, caps.recorded_source, caps.priced_w, caps.priced_source) == (400.0, TRACE, 400.0, TRACE)
    assert (caps.range_w, caps.range_source) == ((150.0, 700.0), TRACE)
    assert caps.describe() == "power limit 400 W (trace)"


def test_the_profile_default_stands_in_without_a_trace_limit_or_for_another_gpu() -> None:
    caps = power_limits(GEMM_HEAVY, H200, 300.0)
    assert (caps.recorded_w, caps.recorded_source, caps.priced_w, caps.priced_source) == \
        (700.0, PROFILE_DEFAULT, 300.0, REQUESTED)
    assert caps.describe() == "power limit 300 W (requested), recorded under 700 W (profile default)"
    elsewhere = power_limits(recorded_under(GEMM_HEAVY, 400.0, (100.0, 400.0), gpu="NVIDIA A100-SXM4-80GB"), H200)
    assert (elsewhere.recorded_w, elsewhere.range_w, elsewhere.range_source) == (700.0, (200.0, 700.0),
                                                                                 PROFILE_DEFAULT)
    assert power_limits(GEMM_HEAVY, H200).as_json() == {
        "recorded_w": 700.0, "recorded_source": PROFILE_DEFAULT, "priced_w": 700.0, "priced_source": PROFILE_DEFAULT,
        "range_w": [200.0, 700.0], "range_source": PROFILE_DEFAULT}


@pytest.mark.parametrize("limit_w", [199.0, 701.0])
def test_a_priced_limit_outside_the_boards_range_is_an_error(limit_w: float) -> None:
    with pytest.raises(PowerLimitError, match=r"outside the board's range 200-700 W \(profile default\)"):
        build_tables(GEMM_HEAVY, H200, power_limit_w=limit_w)


@pytest.mark.parametrize("limit_w", [700.0, 550.0, 250.0])
def test_the_auto_step_pricer_matches_the_tables(limit_w: float) -> None:
    time_s, power_w = auto_step(build_tables(GEMM_HEAVY, H200, power_limit_w=limit_w))
    priced_s, priced_j = auto_step_pricer(GEMM_HEAVY, H200)(limit_w)
    assert priced_s == pytest.approx(time_s, rel=1e-12) and priced_j == pytest.approx(time_s * power_w, rel=1e-12)
