"""Physics of the cost model: monotonicity, the power cap, energy accounting, and the paper's effects."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.cost_model import (
    ClockLimits,
    CostParams,
    KernelInputs,
    kernel_power_w,
    kernel_time_s,
    power_windows,
)
from kdvfs.envs.model.cost_tables import build_tables
from kdvfs.envs.synthetic.generator import generate_transformer_trace, load_workload
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.trace import Category

H200 = load_profile("h200")
PARAMS = CostParams.from_profile(H200)
LIMITS = ClockLimits.of(H200)
# (sm, dram, tensor) of a compute-bound GEMM, a memory-bound copy and a latency-bound tiny kernel (H200 ncu)
KINDS = {"gemm": (0.93, 0.19, 0.93), "copy": (0.09, 0.90, 0.0), "latency": (0.01, 0.01, 0.0)}


def inputs(kind: str, time_s: float = 1e-4, core_mhz: float = 1980.0) -> KernelInputs:
    sm, dram, tensor = KINDS[kind]
    return KernelInputs(*(np.array([v]) for v in (time_s, core_mhz, 3201.0, sm, dram, tensor, np.nan)))


@pytest.mark.parametrize("kind", list(KINDS))
def test_time_falls_and_power_rises_with_the_core_clock(kind: str) -> None:
    cores = np.asarray(H200.clocks.core_mhz[3201], dtype=float)[None, :]
    k = inputs(kind).column()
    time = kernel_time_s(PARAMS, LIMITS, k, cores, np.array([[3201.0]]))
    power = kernel_power_w(PARAMS, LIMITS, k, cores, np.array([[3201.0]]), time)
    assert np.all(np.diff(time[0]) <= 1e-15) and np.all(np.diff(power[0]) >= -1e-9)
    assert time[0, -1] == pytest.approx(1e-4)


@pytest.mark.parametrize("kind", list(KINDS))
def test_time_falls_with_the_memory_clock(kind: str) -> None:
    k = inputs(kind).column()
    low, high = (kernel_time_s(PARAMS, LIMITS, k, np.array([[1980.0]]), np.array([[m]]))[0, 0]
                 for m in (2201.0, 3201.0))
    assert low >= high


def test_memory_bound_kernel_saves_energy_at_a_lower_core_clock_with_little_slowdown() -> None:
    k = inputs("copy").column()
    cores, mem = np.array([[1980.0, 1290.0]]), np.array([[3201.0]])
    time = kernel_time_s(PARAMS, LIMITS, k, cores, mem)
    energy = time * kernel_power_w(PARAMS, LIMITS, k, cores, mem, time)
    assert time[0, 1] / time[0, 0] < 1.03
    assert energy[0, 1] / energy[0, 0] < 0.85


def test_compute_bound_kernel_slows_in_proportion_to_the_core_clock() -> None:
    k = inputs("gemm").column()
    time = kernel_time_s(PARAMS, LIMITS, k, np.array([[1980.0, 990.0]]), np.array([[3201.0]]))
    assert time[0, 1] / time[0, 0] == pytest.approx(2.0, rel=0.05)


def test_measured_reference_power_is_reproduced_at_the_reference() -> None:
    k = replace(inputs("copy"), power_w=np.array([612.0])).column()
    time = kernel_time_s(PARAMS, LIMITS, k, np.array([[1980.0]]), np.array([[3201.0]]))
    assert kernel_power_w(PARAMS, LIMITS, k, np.array([[1980.0]]), np.array([[3201.0]]), time)[0, 0] == \
        pytest.approx(612.0)


@pytest.fixture(scope="module")
def gpt3xl_tables():  # type: ignore[no-untyped-def]
    trace = open_trace("h200/gpt3xl-24layer-b4")
    return trace, build_tables(trace, H200)


def test_tables_have_the_documented_shapes_and_energy_is_power_times_time(gpt3xl_tables) -> None:  # type: ignore[no-untyped-def]
    trace, tables = gpt3xl_tables
    assert tables.time_s.shape == (len(trace), 220) and tables.auto_time_s.shape == (len(trace), 2)
    np.testing.assert_allclose(tables.energy_j, tables.time_s * tables.power_w)
    np.testing.assert_allclose(tables.auto_energy_j, tables.auto_time_s * tables.auto_power_w)


def test_auto_reproduces_the_recorded_durations(gpt3xl_tables) -> None:  # type: ignore[no-untyped-def]
    trace, tables = gpt3xl_tables
    np.testing.assert_allclose(tables.auto_time_s[:, 0], trace.duration_s, rtol=1e-9)


def test_auto_never_averages_above_the_cap(gpt3xl_tables) -> None:  # type: ignore[no-untyped-def]
    _, tables = gpt3xl_tables
    start = np.cumsum(tables.gap_s + tables.auto_time_s[:, 0]) - tables.auto_time_s[:, 0]
    window = power_windows(start, PARAMS.power_window_s)
    for memory in range(2):
        energy = tables.auto_energy_j[:, memory] + tables.gap_s * tables.auto_gap_power_w[:, memory]
        duration = tables.auto_time_s[:, memory] + tables.gap_s
        average = np.bincount(window, energy) / np.bincount(window, duration)
        lowest = tables.auto_core_mhz[:, memory] == H200.clocks.core_mhz[3201][0]
        assert np.all((average <= H200.power.limit_w + 1e-6) | (np.bincount(window, lowest) > 0))


def test_locked_clocks_never_break_the_cap(gpt3xl_tables) -> None:  # type: ignore[no-untyped-def]
    _, tables = gpt3xl_tables
    top = int(np.flatnonzero((tables.pairs_mhz[:, 0] == 1980) & (tables.pairs_mhz[:, 1] == 3201))[0])
    np.testing.assert_allclose(tables.time_s[:, top], tables.auto_time_s[:, 0])


def test_capped_gemm_speeds_up_at_a_lower_memory_clock_on_the_3080ti() -> None:
    profile = load_profile("rtx3080ti")
    config = replace(load_workload("gpt3xl"), layers=1, seq=1024)
    trace = generate_transformer_trace(config, profile)
    tables = build_tables(trace, profile)
    gemm = np.array([k.category is Category.GEMM for k in trace.kernels])
    memory = list(profile.clocks.memory_mhz)
    at_9501, at_5001 = (tables.auto_time_s[gemm, memory.index(m)].sum() for m in (9501, 5001))
    assert at_5001 < at_9501
    at_5001_mhz, at_9501_mhz = (tables.auto_core_mhz[gemm, memory.index(m)] for m in (5001, 9501))
    assert (at_5001_mhz >= at_9501_mhz - 1e-6).all() and at_5001_mhz.mean() > at_9501_mhz.mean()


def test_power_windows_group_kernels_in_time() -> None:
    assert power_windows(np.array([0.0, 0.004, 0.012, 0.013, 0.031]), 0.01).tolist() == [0, 0, 1, 1, 2]


def test_a_communication_kernel_lasts_as_long_at_every_clock_and_costs_less_energy_at_lower_ones() -> None:
    sm, dram, tensor = KINDS["copy"]
    k = KernelInputs(*(np.array([v]) for v in (1e-4, 1980.0, 3201.0, sm, dram, tensor, np.nan)),
                     clock_free=np.array([True])).column()
    cores, mem = np.asarray(H200.clocks.core_mhz[3201], dtype=float)[None, :], np.array([[3201.0]])
    time = kernel_time_s(PARAMS, LIMITS, k, cores, mem)
    energy = time * kernel_power_w(PARAMS, LIMITS, k, cores, mem, time)
    assert np.all(time == 1e-4)
    assert np.all(np.diff(energy[0]) > 0)
    low_mem = np.array([[2201.0]])
    at_low_mem = kernel_time_s(PARAMS, LIMITS, k, np.array([[1980.0]]), low_mem)
    assert at_low_mem[0, 0] == 1e-4
    assert kernel_power_w(PARAMS, LIMITS, k, np.array([[1980.0]]), low_mem, at_low_mem)[0, 0] < \
        kernel_power_w(PARAMS, LIMITS, k, np.array([[1980.0]]), mem, time[:, -1:])[0, 0]


def test_communication_kernels_of_a_trace_are_clock_free_in_its_tables() -> None:
    trace = open_trace("h200/gpt2s-b16")
    first = trace.kernels[0]
    communication = replace(first, name="ncclDevKernel_AllReduce_Sum_bf16_RING_LL", category=Category.COMMUNICATION)
    tables = build_tables(replace(trace, kernels=(communication, *trace.kernels[1:])), H200)
    assert np.allclose(tables.time_s[0], tables.time_s[0, 0])
    assert np.allclose(tables.auto_time_s[0], tables.time_s[0, 0])
    assert tables.energy_j[0].min() < 0.8 * tables.energy_j[0].max()
    assert not np.allclose(tables.time_s[1], tables.time_s[1, 0])
