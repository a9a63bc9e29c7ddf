"""The energy-read replay (``benchmarks/h200/energy_reads.py``) on the bundled H100 recording and on a counter
made here."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.h200.energy_reads import power_as_counter, replay_one, truth
from kdvfs.common.paths import REPO_ROOT

RECORDED = REPO_ROOT / "benchmarks" / "data" / "energy_h100" / "gpt2s-b8.npz"


def made_counter(period_s: float, read_s: float, seconds: float, power_w: float = 500.0) -> np.ndarray:
    """Reads back to back of a counter of ``power_w`` that publishes its total every ``period_s`` from 0.037 s."""
    starts_s = np.arange(0.0, seconds, read_s)
    published_s = 0.037 + np.floor((starts_s + read_s / 2 - 0.037) / period_s) * period_s
    return np.column_stack([starts_s, starts_s + read_s, 1e3 * power_w * np.maximum(published_s, 0.0)])


def test_truth_finds_the_period_and_no_drift_of_a_regular_counter() -> None:
    clock = truth(made_counter(0.1, 0.003, 40.0))
    assert clock["period_s"] == pytest.approx(0.1, rel=1e-5)
    assert clock["missed_updates"] == 0 and clock["drift_s_per_s"] < 1e-4  # the fit's own error: reads of 3 ms
    assert clock["residual_sd_s"] < 0.003 and clock["read_s"] == pytest.approx(0.003)


def test_a_replay_of_the_recorded_counter_places_every_window_and_reads_less_than_back_to_back() -> None:
    counter = np.load(RECORDED)["counter"]
    counter = counter[counter[:, 0] < counter[0, 0] + 40.0]
    replayed = replay_one(counter)
    assert replayed["windows_measured"] == replayed["windows"] > 10
    assert replayed["window_error_pct"]["max_abs"] < 1.0
    assert replayed["reads"] < 0.1 * len(counter)
    assert 0 < replayed["calibration_reads"] < replayed["reads"]


def test_a_power_field_that_is_the_counters_mean_stands_in_for_it() -> None:
    counter = made_counter(0.1, 0.003, 20.0, power_w=500.0)
    starts_s = np.arange(0.0, 20.0, 0.004)
    power = np.column_stack([starts_s, starts_s + 6e-5, np.full(len(starts_s), 5e5)])
    stand_in = power_as_counter(truth(counter), power)
    assert stand_in is not None and abs(stand_in["mean"]) < 0.5 and stand_in["sd"] < 0.5
    assert power_as_counter(truth(counter), power[:1]) is None
