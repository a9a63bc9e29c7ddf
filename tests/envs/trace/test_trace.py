"""The Trace data model: validation, immutability, numeric columns."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kdvfs.common.errors import TraceFormatError
from kdvfs.envs.trace.trace import Category, Features, Kernel, Kind, Phase, Trace, TraceMeta


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
