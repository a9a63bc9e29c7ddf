"""The states ahead of a step (``states_ahead``): bit for bit the elementwise numpy the controller read them with
before they were compiled, for any anchor, pace, scale and readings."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kdvfs.envs.env.observing.live import PredictedElapsed
from kdvfs.runtime.controller.decisions.look_ahead import states_ahead


def numpy_states(host_s: np.ndarray, anchor: tuple[int, float, int], now_s: float, interval_s: float, n: int,
                 least_kernel: int, start_s: float, scale: float, cumulative_s: np.ndarray,
                 predicted: PredictedElapsed, in_effect: int) -> tuple[np.ndarray, ...]:
    """The states as the controller computed them in numpy (searchsorted, clip, fancy indexing)."""
    times_s = now_s + interval_s * np.arange(1, n + 1)
    found = np.searchsorted(host_s, host_s[anchor[2]] + (times_s - anchor[1]), side="right") - 1
    kernels = np.maximum(np.clip(found, anchor[2], len(host_s) - 2).astype(np.int64), least_kernel)
    pair, seconds_s, kernel, factor = predicted.reading(in_effect)
    column = cumulative_s[:, pair]
    model_s = seconds_s + (column[np.maximum(kernels, kernel)] - column[kernel]) * factor
    return kernels, (times_s - start_s) / scale, cumulative_s[kernels, 0], model_s


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), kernels=st.integers(1, 60), n=st.integers(1, 80),
       interval_s=st.floats(1e-5, 5e-3), scale=st.floats(0.5, 2.0), readings=st.integers(0, 3))
def test_states_ahead_are_the_numpy_states_to_the_last_bit(seed: int, kernels: int, n: int, interval_s: float,
                                                           scale: float, readings: int) -> None:
    rng = np.random.default_rng(seed)
    host_s = np.concatenate([[0.0], np.cumsum(rng.uniform(1e-6, 2e-3, kernels))])
    cumulative_s = np.concatenate([np.zeros((1, 3)), np.cumsum(rng.uniform(1e-6, 2e-3, (kernels, 3)), axis=0)])
    predicted = PredictedElapsed(cumulative_s, 3e-4, rng.uniform(1.0, 1.1, 3) if seed % 2 else None)
    for _ in range(readings):
        predicted.at(int(rng.integers(kernels + 1)), int(rng.integers(3)))
    start_s = float(rng.uniform(0.0, 100.0))
    anchor_kernel = int(rng.integers(kernels))
    anchor = (0, start_s + float(host_s[anchor_kernel]) * float(rng.uniform(0.8, 1.2)), anchor_kernel)
    now_s = anchor[1] + float(rng.uniform(0.0, 1e-3))
    least_kernel, in_effect = int(rng.integers(kernels)), int(rng.integers(3))
    expected = numpy_states(host_s, anchor, now_s, interval_s, n, least_kernel, start_s, scale, cumulative_s,
                            predicted, in_effect)
    found = states_ahead(host_s, anchor[2], anchor[1], now_s, interval_s, n, least_kernel, start_s, scale,
                         cumulative_s, *predicted.reading(in_effect))
    assert found[0].dtype == np.int64
    for got, want in zip(found, expected, strict=True):
        assert np.array_equal(got, want)


def test_the_reading_counts_on_from_the_last_reading_at_its_pair_with_a_changes_stall() -> None:
    predicted = PredictedElapsed(np.array([[0.0, 0.0], [1.0, 2.0], [3.0, 5.0], [6.0, 9.0]]), 0.5)
    assert predicted.reading(1) == (1, 0.0, 0, 1.0)  # nothing read: the pair in effect from the start
    predicted.at(2, 0)
    assert predicted.reading(0) == (0, 3.0, 2, 1.0)
    assert predicted.reading(1) == (0, 3.5, 2, 1.0)  # a change to pair 1 ahead: its stall, kernels still at pair 0
    pair, seconds_s, kernel, factor = predicted.reading(1)
    assert seconds_s + (predicted.cumulative_s[3, pair] - predicted.cumulative_s[kernel, pair]) * factor \
        == predicted.at(3, 1)


def test_the_reading_carries_the_drift_factor_of_its_pair() -> None:
    predicted = PredictedElapsed(np.array([[0.0, 0.0], [1.0, 2.0], [3.0, 5.0]]), 0.0, np.array([1.0, 1.5]))
    predicted.at(1, 1)
    pair, seconds_s, kernel, factor = predicted.reading(1)
    assert (pair, factor) == (1, 1.5)
    assert seconds_s + (predicted.cumulative_s[2, pair] - predicted.cumulative_s[kernel, pair]) * factor \
        == predicted.at(2, 1)
