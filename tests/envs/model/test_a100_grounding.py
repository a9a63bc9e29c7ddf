"""The A100 profile against the public A100 facts it is grounded in (``docs/design/cost-model.md``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.cost_tables import build_tables
from kdvfs.envs.synthetic.generator import generate_transformer_trace, load_workload

OPTIMUM_BAND_MHZ = (1080.0, 1290.0)
"""Voltage floor measured up to 1080 MHz; IT4I's energy-saving cap at 1290 MHz (profile sources)."""


def _uniform_curve() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(core MHz, step energy J, step time s) of one GPT-3 XL layer at each locked core clock."""
    profile = load_profile("a100-sxm4")
    trace = generate_transformer_trace(replace(load_workload("gpt3xl"), layers=1), profile)
    tables = build_tables(trace, profile)
    energy = tables.energy_j.sum(axis=0) + (tables.gap_s[:, None] * tables.gap_power_w[None, :]).sum(axis=0)
    return tables.pairs_mhz[:, 0], energy, tables.time_s.sum(axis=0) + tables.gap_s.sum()


def test_a100_profile_states_its_limits_and_idle_power() -> None:
    profile = load_profile("a100-sxm4")
    assert profile.power.limit_w == 400.0 and profile.power.limit_range_w == (100.0, 500.0)
    assert 50.0 <= profile.power.idle_w <= 72.0


def test_energy_optimal_uniform_clock_of_a_gpt3_layer_lies_in_the_grounded_band() -> None:
    core, energy, time = _uniform_curve()
    best = int(np.argmin(energy))
    assert OPTIMUM_BAND_MHZ[0] <= core[best] <= OPTIMUM_BAND_MHZ[1]
    top, bottom = int(np.argmax(core)), int(np.argmin(core))
    cap = int(np.argmin(np.abs(core - OPTIMUM_BAND_MHZ[1])))
    assert energy[cap] < energy[top] and time[cap] <= 1.10 * time[top]
    assert energy[bottom] > energy[best] and energy[bottom] > energy[top]
