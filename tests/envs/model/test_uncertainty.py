"""Parameter uncertainty: seeded samples within every stated range, ranges that contain the nominal figure."""

from __future__ import annotations

import pytest

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.uncertainty import LATENCY, UncertaintySpec, ranged_parameters, sampled_profiles

H200 = load_profile("h200")


def _values(profile):  # type: ignore[no-untyped-def]
    return {**{name: p.value for name, p in profile.cost_model.items()}, LATENCY: profile.switching.latency_mean_s}


def test_every_estimate_and_the_latency_are_varied() -> None:
    ranges = ranged_parameters(H200)
    estimates = {name for name, p in H200.cost_model.items() if p.status == "estimate"}
    assert estimates | {LATENCY} <= set(ranges)
    assert LATENCY not in ranged_parameters(H200, vary_latency=False)


def test_samples_lie_within_their_ranges_and_are_reproducible() -> None:
    spec = UncertaintySpec(samples=8, seed=3)
    first, again = sampled_profiles(H200, spec), sampled_profiles(H200, spec)
    assert len(first) == 8 and [_values(p) for p in first] == [_values(p) for p in again]
    ranges = ranged_parameters(H200)
    for sample in first:
        values = _values(sample)
        for name, (low, high) in ranges.items():
            assert low <= values[name] <= high
        calibrated = [n for n, p in H200.cost_model.items() if p.range is None]
        assert all(values[n] == H200.cost_model[n].value for n in calibrated)
    assert _values(first[0]) != _values(sampled_profiles(H200, UncertaintySpec(samples=8, seed=4))[0])


def test_latency_stays_when_it_is_not_varied() -> None:
    for sample in sampled_profiles(H200, UncertaintySpec(samples=3, vary_latency=False)):
        assert sample.switching.latency_mean_s == H200.switching.latency_mean_s


def test_sample_counts_are_checked() -> None:
    with pytest.raises(KdvfsError, match="at least 1"):
        UncertaintySpec(samples=0)


def test_transferred_estimates_are_varied_over_wider_ranges() -> None:
    a100 = load_profile("a100-sxm4")
    ranges = ranged_parameters(a100)
    transferred = [name for name, p in a100.cost_model.items() if p.transferred_from is not None]
    assert transferred, "the A100 profile still carries estimates transferred from the H200"
    for name in transferred:
        param, (low, high) = a100.cost_model[name], ranges[name]
        assert param.range is not None and low <= param.range[0] and high >= param.range[1]
        assert high - low > param.range[1] - param.range[0] or param.range[0] == param.range[1]
    grounded = a100.cost_model["voltage_knee_fraction"]
    assert grounded.transferred_from is None and ranges["voltage_knee_fraction"] == grounded.range
    for sample in sampled_profiles(a100, UncertaintySpec(samples=8)):
        assert all(low <= _values(sample)[name] <= high for name, (low, high) in ranges.items())


def test_widening_stays_within_valid_bounds() -> None:
    from kdvfs.envs.gpu.profiles import CostParam
    from kdvfs.envs.model.uncertainty import TRANSFER_WIDENING, plausible_range

    share = CostParam(0.6, "estimate", "estimate: H200 value", (0.2, 0.9), "H200 range", "h200")
    assert plausible_range("traffic_core_share", share) == pytest.approx((max(0.0, 0.6 - TRANSFER_WIDENING * 0.4), 1.0))
    own = CostParam(0.6, "estimate", "estimate", (0.2, 0.9), "why")
    assert plausible_range("traffic_core_share", own) == (0.2, 0.9)
