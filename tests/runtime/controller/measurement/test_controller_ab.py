"""Interleaved A/B windows: the schedule, the paired estimate, the drift model, the guard on the same
evidence, and bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from controller_helpers import LATENCY_MS, TRACE, fake_controller, log_records, run_steps, write_plan
from scipy import stats

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.model.drift import Drift, DriftModel
from kdvfs.runtime.controller import Controller
from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.measurement.ab import AUTO, CONTROLLED, AbSchedule
from kdvfs.runtime.controller.measurement.estimator import Interval, Paired, t_975
from kdvfs.runtime.controller.measurement.guard import Guard
from kdvfs.runtime.device.errors import DeviceError
from kdvfs.runtime.testing.ab_truth import true_effect
from tests.runtime.summaries import checked

AB = {"ab_share": 0.25, "window_steps": 10, "window_s": 0.5}


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_plan(tmp_path_factory.mktemp("plan") / "plan.json")


def _run(plan: Path, tmp_path: Path, seconds: float, seed: int = 0, **options: Any) -> tuple[Controller, Any, Path]:
    log = tmp_path / f"run{seed}.jsonl"
    controller, gpu, _ = fake_controller(plan, drift=DriftModel(seed=seed), log=str(log),
                                         **{**AB, "ab_seed": seed, **options})
    with controller:
        while gpu.clock.now_s() < seconds:
            run_steps(controller, 20)
    return controller, gpu, log


def test_schedule_pairs_each_auto_window_with_an_adjacent_controlled_one() -> None:
    for share in (0.25, 0.5, 0.75):
        schedule = AbSchedule(share, seed=3)
        slots = [schedule.next() for _ in range(400)]
        assert np.mean([s.arm == AUTO for s in slots]) == pytest.approx(share, abs=0.01)
        pairs: dict[int, list[tuple[int, str]]] = {}
        for position, slot in enumerate(slots):
            if slot.pair is not None:
                pairs.setdefault(slot.pair, []).append((position, slot.arm))
        assert all(len(p) == 2 and p[1][0] == p[0][0] + 1 and {p[0][1], p[1][1]} == {AUTO, CONTROLLED}
                   for p in pairs.values())
        first_auto = np.mean([p[0][1] == AUTO for p in pairs.values()])
        assert 0.35 < first_auto < 0.65  # a random order, not always AB
    assert {AbSchedule(0.0).next().arm for _ in range(5)} == {CONTROLLED} and not AbSchedule(0.0).measuring


def test_paired_interval_is_the_student_t_interval() -> None:
    values = np.random.default_rng(1).normal(0.3, 0.2, 17)
    paired = Paired()
    for value in values:
        paired.add(float(value))
    interval = paired.interval()
    lo, hi = stats.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=stats.sem(values))
    assert interval is not None and (interval.lo_pct, interval.hi_pct) == pytest.approx((lo, hi))
    single = Paired()
    single.add(1.0)
    assert single.interval() is None


def test_the_t_quantile_is_scipys_to_the_bit() -> None:
    assert all(t_975(dof) == float(stats.t.ppf(0.975, dof)) for dof in [*range(1, 400), 1_000, 10_000, 1_000_000])


def test_drift_model_has_the_measured_h200_figures() -> None:
    model = DriftModel(seed=5)
    assert model.drift_pct(120.0) == pytest.approx((2.1, 2.1))
    assert model.drift_pct(0.0) == (0.0, 0.0) and model.drift_pct(600.0)[0] < 3.5
    drift = Drift(model)
    factors = np.array([drift.factors(0.0) for _ in range(20000)])
    windows = factors.reshape(-1, 2, 10, 2).mean(axis=2)
    diff_sd_pct = np.std((windows[:, 1] - windows[:, 0]) * 100, axis=0)
    assert diff_sd_pct == pytest.approx([0.2, 0.4], rel=0.1)


def test_measured_interval_covers_the_true_effect_under_drift(plan_file: Path, tmp_path: Path) -> None:
    covered = []
    for seed in range(4):
        controller, gpu, log = _run(plan_file, tmp_path, 60.0, seed)
        measured = controller.summary.measured
        truth = true_effect(gpu, log_records(log, "window"))
        assert truth is not None and measured.windows_auto >= 20
        (e_lo, e_hi), (t_lo, t_hi) = measured.energy_saved_ci95_pct, measured.slowdown_ci95_pct
        assert e_hi - e_lo < 1.0 and t_hi - t_lo < 1.0
        # wide tolerance on a handful of seeds: within one half-width beyond the interval
        assert e_lo - (e_hi - e_lo) / 2 <= truth.energy_saved_pct <= e_hi + (e_hi - e_lo) / 2
        assert t_lo - (t_hi - t_lo) / 2 <= truth.slowdown_pct <= t_hi + (t_hi - t_lo) / 2
        covered.append(e_lo <= truth.energy_saved_pct <= e_hi and t_lo <= truth.slowdown_pct <= t_hi)
        assert not controller.summary.backed_off
    assert sum(covered) >= 2


def test_summary_has_the_measured_figures_and_the_net_effect(plan_file: Path, tmp_path: Path) -> None:
    controller, _, log = _run(plan_file, tmp_path, 20.0)
    summary = checked(controller.summary)  # the measured figures' keys: the schema's
    share = summary.controlled_steps / summary.steps
    assert 0.5 < share < 0.8
    assert summary.measured_net.energy_saved_pct == pytest.approx(summary.measured.energy_saved_pct * share)
    pairs = log_records(log, "pair")
    assert pairs and pairs[-1]["measured"]["slowdown_pct"] == pytest.approx(summary.measured.slowdown_pct)


def test_dry_run_with_drift_measures_nothing_and_the_guard_stays(plan_file: Path, tmp_path: Path) -> None:
    for seed in range(3):
        controller, gpu, log = _run(plan_file, tmp_path, 60.0, seed, dry_run=True, budget=0.01)
        summary = controller.summary
        assert not summary.backed_off and not gpu.set_calls
        lo, hi = summary.measured.slowdown_ci95_pct
        assert lo - 0.1 <= 0.0 <= hi + 0.1 and hi - lo < 0.5
        assert not log_records(log, "backoff")


def test_guard_catches_a_plan_over_its_budget_and_resumes_later(plan_file: Path, tmp_path: Path) -> None:
    # the plan takes ~5% (its own budget); a 3% guard budget is overrun by 2 points
    controller, gpu, log = _run(plan_file, tmp_path, 100.0, budget=0.025, guard_margin=0.005, guard_retry_s=30.0)
    backoffs = log_records(log, "backoff")
    assert backoffs and gpu.steps[backoffs[0]["step"]].end_s < 60.0
    assert "exceeds the budget" in controller.summary.backoff_reason
    step = backoffs[0]["step"]
    assert all(np.all(s.applied == gpu.costs.auto_index) for s in gpu.steps[step + 2:step + 100])
    assert log_records(log, "resume") and controller.summary.guard_backoffs >= 2


class Evidence:
    """The slowdowns (%) of the pairs so far, one per window, as a guard's estimate reads them."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def estimate(self, since: int) -> Interval | None:
        paired = Paired()
        for value in self.values[since:]:
            paired.add(value)
        return paired.interval()

    def observe(self, guard: Guard, value: float, now_s: float) -> str:
        self.values.append(value)
        return guard.observe(now_s)


def test_in_cpu_test_mode_the_guard_stays_off_and_the_summary_says_why(plan_file: Path, tmp_path: Path) -> None:
    # the overrun above, but in CPU test mode, where step times are CPU times no clock moves: noise to the guard
    controller, _, log = _run(plan_file, tmp_path, 40.0, budget=0.025, guard_margin=0.005, cpu_test_mode=True)
    summary = controller.summary
    assert not log_records(log, "backoff") and not summary.backed_off and summary.guard_slowdown_pct > 1.0
    assert "CPU test mode" in summary.guard_off and "noise" in summary.guard_off
    assert "mean nothing" in summary.not_measured_on_a_gpu
    plain, _, _ = _run(plan_file, tmp_path, 1.0)
    assert plain.summary.guard_off is None and plain.summary.not_measured_on_a_gpu is None


def test_guard_off_observes_but_never_backs_off() -> None:
    evidence = Evidence()
    guard = Guard(0.01, 0.005, 3, 10.0, evidence.estimate, lambda: len(evidence.values), off="noise")
    assert [evidence.observe(guard, v, 2.0) for v in (2.0, 2.1, 1.9)] == [Guard.OK] * 3
    slowdown = guard.slowdown()
    assert not guard.backed_off and slowdown is not None and slowdown.n == 3


def test_guard_backs_off_only_on_confident_evidence() -> None:
    evidence, wide_evidence = Evidence(), Evidence()
    guard = Guard(0.01, 0.005, 3, 10.0, evidence.estimate, lambda: len(evidence.values))
    wide = Guard(0.01, 0.005, 3, 10.0, wide_evidence.estimate, lambda: len(wide_evidence.values))
    assert [wide_evidence.observe(wide, v, 0.0) for v in (5.0, -3.0, 5.0)] == [Guard.OK] * 3  # reaches below
    assert [evidence.observe(guard, v, 2.0) for v in (2.0, 2.1, 1.9)] == [Guard.OK, Guard.OK, Guard.BACK_OFF]
    assert guard.backed_off and guard.tick(11.0) == Guard.OK and guard.tick(12.0) == Guard.RESUME
    assert not guard.backed_off and guard.slowdown() is None  # fresh evidence after the resume


def test_share_zero_turns_measurement_off_and_says_so(plan_file: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    controller, _, log = _run(plan_file, tmp_path, 5.0, ab_share=0.0)
    measured = controller.summary.measured
    assert measured.windows_auto == 0 and measured.slowdown_pct is None
    assert len(log_records(log, "measurement")) == 1 and "A/B measurement off" in capsys.readouterr().err


class NoCounter:
    """A GPU whose energy counter cannot be read."""

    def __init__(self, gpu: Any) -> None:
        self._gpu = gpu

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gpu, name)

    def energy_j(self) -> float:
        raise DeviceError("energy counter not supported on this GPU")


def test_no_energy_counter_measures_time_only_and_says_so_once(plan_file: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    _, gpu, timeline = fake_controller(plan_file, **AB)
    controller = Controller(str(plan_file), TRACE, device=NoCounter(gpu), timeline=timeline, clock=gpu.clock,
                            latency_ms=LATENCY_MS, energy_read_every_s=0.0, **AB)
    with controller:
        while gpu.clock.now_s() < 15.0:
            run_steps(controller, 20)
    summary = controller.summary
    assert summary.measured.energy_saved_pct is None and summary.measured.slowdown_pct is not None
    assert not summary.energy_measured and capsys.readouterr().err.count("energy measurement off") == 1
    assert gpu.calls[-1].name == "reset_clocks"


def test_bad_ab_settings_are_clear_errors(plan_file: Path) -> None:
    for share in (-0.1, 0.95):
        with pytest.raises(KdvfsError, match="--ab-share"):
            ControllerConfig.from_options(str(plan_file), "t", ab_share=share)
    controller, gpu, _ = fake_controller(plan_file, window_s=0.001)
    with pytest.raises(KdvfsError, match="switching latency"), controller:
        pass
    assert not gpu.set_calls


def test_kdvfs_report_reads_a_run_log_and_plots_it(plan_file: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from kdvfs.runtime.cli import main

    _, _, log = _run(plan_file, tmp_path, 10.0)
    assert main(["report", str(log), "--plot", str(tmp_path / "run.png")]) == 0
    out = capsys.readouterr().out
    assert "auto (A)" in out and "predicted" in out and (tmp_path / "run.png").stat().st_size > 10_000
    (tmp_path / "empty.jsonl").write_text('{"event": "start"}\n')
    assert main(["report", str(tmp_path / "empty.jsonl")]) == 2
    assert "no A/B windows" in capsys.readouterr().err
