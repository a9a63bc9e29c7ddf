"""The fake GPU simulated kernel by kernel: looking early changes nothing, disturbances are seeded and the
truth stays the cost model's."""

from __future__ import annotations

import numpy as np

from kdvfs.envs.model.drift import DriftModel
from kdvfs.runtime.testing.fake_gpu import FakeGpu, FakeStepTimeline, VirtualClock
from tests.runtime.controller_helpers import small_problem


def _gpu(clock: VirtualClock, **options: float) -> FakeGpu:
    problem = small_problem()
    return FakeGpu(problem.costs, problem.profile, 0.002, 0.0001, clock, **options)  # type: ignore[arg-type]


def test_looking_into_a_running_step_does_not_change_it() -> None:
    quiet, looked = VirtualClock(), VirtualClock()
    gpu_a, gpu_b = _gpu(quiet, duration_noise=0.02, seed=4), _gpu(looked, duration_noise=0.02, seed=4)
    timeline = FakeStepTimeline(gpu_b, looked, anchor_kernels=(10, 50, 90))
    for index in range(3):
        looked.advance_to(looked.now_s() + 0.01)
        gpu_b.clocks_mhz()
        passed = timeline.passed_anchor(index, -1)
        assert passed is None or passed[1] <= looked.now_s()
        a, b = gpu_a.run_step(), timeline.wait((0.0, 1000, index))
        assert np.isclose(a.end_s, b.end_s) and np.isclose(a.energy_j, gpu_b.steps[-1].energy_j)
        assert np.allclose(b.anchors_s, gpu_b.steps[-1].kernel_start_s[[10, 50, 90]])


def test_disturbances_are_seeded_and_the_truth_is_the_cost_models() -> None:
    problem = small_problem()
    runs = []
    for seed in (1, 1, 2):
        clock = VirtualClock()
        gpu = _gpu(clock, drift=DriftModel(seed=seed), duration_noise=0.02, latency_std_s=0.001, seed=seed)
        gpu.lock_clocks_mhz(1410, 3201)
        runs.append((gpu.run_step(), gpu))
    (first, gpu_1), (again, _), (other, _) = runs
    assert first.end_s == again.end_s and first.end_s != other.end_s
    assert gpu_1.latencies_s[0] != 0.002  # drawn from the spread
    applied = first.applied
    kernels = np.arange(problem.costs.kernels)
    model_s = float(problem.costs.time_s[kernels, applied].sum()) + 0.0001  # one change, one stall
    assert np.isclose(first.model_time_s, model_s) and not np.isclose(first.end_s - first.start_s, model_s)
