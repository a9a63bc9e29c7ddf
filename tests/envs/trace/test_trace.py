"""The Trace data model: validation, immutability, numeric columns."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kdvfs.common.errors import TraceFormatError
from kdvfs.envs.trace.trace import Category, Features, Kernel, Kind, Phase, Trace, TraceMeta, with_measured_gaps


def make_kernel(duration_s: float = 1e-5, gap_before_s: float = 1e-6, features: Features | None = None) -> Kernel:
    return Kernel("k", Kind.KERNEL, Category.GEMM, Phase.FORWARD, duration_s, gap_before_s, features=features)


def test_columns_and_totals() -> None:
    features = Features(0.5, 0.25, None, 1500.0, "test")
    trace = Trace(TraceMeta("gpu", "w", "s"), (make_kernel(2e-5, 1e-6, features), make_kernel(1e-5, 3e-6)))
    assert trace.duration_s.tolist() == [2e-5, 1e-5]
    assert trace.step_time_s == pytest.approx(3.4e-5)
    assert trace.busy_s == pytest.approx(3e-5)
    assert trace.has_features.tolist() == [True, False]
    assert trace.sm_util[0] == 0.5 and np.isnan(trace.sm_util[1])
    assert np.isnan(trace.tensor_util).all()


def test_trace_is_immutable() -> None:
    trace = Trace(TraceMeta("gpu", "w", "s", measurements={"energy_j_per_step": 1.0}), (make_kernel(),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        trace.kernels = ()  # type: ignore[misc]
    with pytest.raises(ValueError):
        trace.duration_s[0] = 1.0
    with pytest.raises(TypeError):
        trace.meta.measurements["energy_j_per_step"] = 2.0  # type: ignore[index]


@pytest.mark.parametrize(("duration_s", "gap_s"), [(0.0, 0.0), (-1e-6, 0.0), (float("nan"), 0.0), (1e-6, -1e-9)])
def test_bad_times_are_rejected(duration_s: float, gap_s: float) -> None:
    with pytest.raises(TraceFormatError):
        make_kernel(duration_s, gap_s)


@pytest.mark.parametrize("sm_util", [-0.1, 1.5])
def test_utilisation_outside_unit_interval_is_rejected(sm_util: float) -> None:
    with pytest.raises(TraceFormatError, match="sm_util"):
        Features(sm_util, 0.1, None, None, "test")


def test_empty_trace_is_rejected() -> None:
    with pytest.raises(TraceFormatError, match="no kernels"):
        Trace(TraceMeta("gpu", "w", "s"), ())


@pytest.mark.parametrize("measured_s", [2.2e-5, 3.2e-5, 3.4e-5, 6e-5, None])
def test_measured_gaps_shrink_to_a_shorter_step_and_lead_a_longer_one(measured_s: float | None) -> None:
    """A profiled step (34 us: 30 busy, 4 idle) against its unprofiled time: shorter, the idle shrinks in
    proportion; longer, the host's time between steps goes before the first kernel; busy time never changes."""
    measurements = {} if measured_s is None else {"step_time_s": measured_s}
    trace = Trace(TraceMeta("gpu", "w", "s", measurements=measurements),
                  (make_kernel(2e-5, 1e-6), make_kernel(1e-5, 3e-6)))
    timed = with_measured_gaps(trace)
    assert timed.busy_s == pytest.approx(trace.busy_s)
    assert timed.step_time_s == pytest.approx(trace.step_time_s if measured_s is None else max(measured_s, 3e-5))
    if measured_s is not None and measured_s > trace.step_time_s:
        assert timed.gap_before_s.tolist() == pytest.approx([1e-6 + measured_s - 3.4e-5, 3e-6])
    elif measured_s is not None and measured_s > trace.busy_s:
        assert timed.gap_before_s[1] / timed.gap_before_s[0] == pytest.approx(3.0)
    elif measured_s is not None:  # shorter than its kernels: no idle left
        assert timed.gap_before_s.tolist() == [0.0, 0.0]
