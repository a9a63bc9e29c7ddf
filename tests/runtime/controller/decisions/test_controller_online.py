"""The frozen policy deciding online inside each controlled step, on the fake GPU (virtual clock)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kdvfs.common.paths import shipped_policy_path
from kdvfs.envs.model.drift import DriftModel
from kdvfs.runtime.controller.decisions.actuator import Actuator
from kdvfs.runtime.controller.decisions.live_clocks import LiveClocks
from kdvfs.runtime.controller.decisions.online import HOLD_MIN_S, OnlineSteps
from kdvfs.runtime.controller.event_log import EventLog, seconds
from kdvfs.runtime.controller.measurement.budget_feedback import FEEDBACK_GAIN
from kdvfs.runtime.controller.measurement.estimator import Interval
from kdvfs.runtime.controller.timing import anchors as anchors_module
from kdvfs.runtime.testing.fake_gpu import FakeGpu, VirtualClock
from tests.runtime.controller_helpers import fake_controller, log_records, run_steps, small_problem
from tests.runtime.summaries import checked

POLICY = shipped_policy_path("h200")
ANCHOR_KERNELS = tuple(range(8, 112, 8))  # the small step has 115 kernels


def _online_run(tmp_path: Path, steps: int = 40, **options: object) -> tuple[object, FakeGpu, Path]:
    log = tmp_path / "run.jsonl"
    controller, gpu, timeline = fake_controller(POLICY, drift=DriftModel(seed=1), log=str(log), **options)
    timeline.anchor_kernels = ANCHOR_KERNELS
    with controller:
        run_steps(controller, steps)
    return controller, gpu, log


def test_the_policy_decides_inside_each_controlled_step_and_the_gpu_is_restored(tmp_path: Path) -> None:
    controller, gpu, log = _online_run(tmp_path)
    summary = checked(controller.summary)  # type: ignore[attr-defined]
    assert summary.source == "policy h200.kdvfs-policy.npz (online)" and summary.controlled_steps > 20
    assert summary.online_decisions > 20 and summary.online.progress["anchor"] > 0
    decisions = log_records(log, "decision")
    assert len(decisions) == summary.online_decisions
    assert {"step", "kernel", "source", "in_effect", "pending", "budget_pct", "budget_used", "affordable_pct",
            "action", "clocks", "wall_us"} <= set(decisions[0])
    assert {d["source"] for d in decisions} == {"anchor", "expected"}
    for step in {d["step"] for d in decisions}:
        kernels = [d["kernel"] for d in decisions if d["step"] == step]
        assert kernels == sorted(kernels)  # the position never goes back within a step
    online_requests = [r for r in log_records(log, "request") if r.get("online")]
    assert online_requests and all(r["due_s"] >= r["request_s"] for r in online_requests)
    assert gpu.set_calls[-1].name == "reset_clocks" and summary.gpu_restored


def test_a_dry_run_decides_and_logs_but_changes_nothing(tmp_path: Path) -> None:
    controller, gpu, log = _online_run(tmp_path, dry_run=True)
    summary = checked(controller.summary)  # type: ignore[attr-defined]
    assert gpu.set_calls == [] and summary.online_decisions > 0 and log_records(log, "decision")
    assert summary.online.step_budget == pytest.approx(0.05)  # the run's budget: no feedback
    assert summary.online.took_effect.get("observed", 0) == 0  # nothing is read in a dry run


def test_replay_applies_the_noise_free_rollout_and_decides_nothing(tmp_path: Path) -> None:
    controller, _, log = _online_run(tmp_path, online=False)
    summary = controller.summary  # type: ignore[attr-defined]
    assert summary.source.endswith("(replayed)") and summary.online is None
    assert not log_records(log, "decision") and summary.switches > 0


def test_an_exception_in_training_returns_the_gpu_to_auto(tmp_path: Path) -> None:
    controller, gpu, _ = fake_controller(POLICY)
    with pytest.raises(RuntimeError), controller:
        run_steps(controller, 20)
        raise RuntimeError("CUDA out of memory")
    assert gpu.set_calls and gpu.set_calls[-1].name == "reset_clocks"


def _clocks(gpu: FakeGpu, clock: VirtualClock, spread_s: float) -> tuple[LiveClocks, Actuator, str]:
    from kdvfs.agents.learned.policy.frozen import FrozenPolicy
    from kdvfs.agents.learned.policy.online import OnlinePolicy

    problem = small_problem()
    online = OnlinePolicy(FrozenPolicy.load(POLICY, problem.profile), problem)
    actuator = Actuator(gpu, False, problem.profile.clocks.default_memory_mhz, EventLog(None), clock)
    top_mhz = problem.profile.clocks.max_core_mhz
    locked = next(label for label in online.labels if not label.startswith("auto")
                  and int(label.split(":")[0]) < top_mhz - 100)  # auto reads as the top clock on the fake
    return LiveClocks(online, actuator, gpu, gpu.latency_s, spread_s, False), actuator, locked


def test_a_lock_takes_effect_when_the_clock_read_shows_it() -> None:
    clock = VirtualClock()
    problem = small_problem()
    gpu = FakeGpu(problem.costs, problem.profile, 0.004, 0.0, clock)
    clocks, actuator, locked = _clocks(gpu, clock, spread_s=0.01)  # a timeout only after 34 ms
    actuator.request(locked)
    clocks.update(clock.now_s())
    assert not clocks.free
    clock.advance_to(0.003)
    clocks.update(clock.now_s())
    assert not clocks.free  # the GPU is not there yet
    for _ in range(40):  # the change applies at the first kernel starting after 4 ms
        clock.advance_to(clock.now_s() + 0.0005)
        clocks.update(clock.now_s())
    assert clocks.free and clocks.online.labels[clocks.in_effect] == locked
    assert clocks.took_effect == {"observed": 1} and 1.0 <= clocks.last_latency_ratio <= 6.0


def test_a_lock_never_seen_counts_as_in_effect_after_the_latency_and_3_sd() -> None:
    class Throttled(FakeGpu):
        def clocks_mhz(self) -> tuple[float, float]:
            return float(self.profile.clocks.max_core_mhz), float(self.profile.clocks.default_memory_mhz)

    clock = VirtualClock()
    problem = small_problem()
    clocks, actuator, locked = _clocks(Throttled(problem.costs, problem.profile, 0.004, 0.0, clock), clock, 0.001)
    actuator.request(locked)
    clock.advance_to(0.0065)
    clocks.update(clock.now_s())
    assert not clocks.free
    clock.advance_to(0.0071)
    clocks.update(clock.now_s())
    assert clocks.free and clocks.took_effect == {"timeout": 1}


def test_a_held_change_is_pending_from_its_decision_and_arrives_a_latency_after_its_request() -> None:
    clock = VirtualClock()
    problem = small_problem()
    gpu = FakeGpu(problem.costs, problem.profile, 0.004, 0.0, clock)
    clocks, actuator, locked = _clocks(gpu, clock, spread_s=0.0)
    clocks.dry_run = True
    pair = clocks.online.labels.index(locked)
    clocks.hold(pair, decided_s=0.001)
    clock.advance_to(0.020)
    clocks.update(clock.now_s())
    assert clocks.pending == pair and clocks.held and clocks.arrival_check_s(clock.now_s(), 1e-4) == float("inf")
    actuator.request(locked)  # its request goes out at 20 ms
    clocks.update(clock.now_s())
    assert not clocks.held and clocks.requested_s == 0.001 and clocks.issued_s == 0.020
    assert clocks.arrival_check_s(clock.now_s(), 1e-4) == pytest.approx(0.024)
    clock.advance_to(0.0239)
    clocks.update(clock.now_s())
    assert clocks.pending == pair
    clock.advance_to(0.024)
    clocks.update(clock.now_s())
    assert clocks.free and clocks.in_effect == pair and clocks.took_effect == {"assumed": 1}
    clocks.hold(0, decided_s=0.025)
    clocks.drop()
    assert clocks.free and clocks.in_effect == pair


def _alternate_pairs(monkeypatch: pytest.MonkeyPatch, policy: Any) -> None:
    """Make ``policy`` (:class:`OnlinePolicy`) ask for another pair at every evaluation."""
    decide, asked = policy.decide, [0]

    def alternate(self: Any, *args: Any) -> Any:
        decision = decide(self, *args)
        if decision.evaluated:
            asked[0] += 1
            decision = decision._replace(pair=1 + asked[0] % 2)
        return decision

    monkeypatch.setattr(policy, "decide", alternate)


def test_a_decided_change_is_requested_one_latency_before_its_kernel(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy that asks for another pair at every evaluation: its changes are held and requested one latency
    before the kernel they were planned for (not at once, up to a kernel's time earlier)."""
    from kdvfs.agents.learned.policy.online import OnlinePolicy

    log = tmp_path / "run.jsonl"
    controller, _, timeline = fake_controller(POLICY, log=str(log))
    timeline.anchor_kernels = ANCHOR_KERNELS
    _alternate_pairs(monkeypatch, OnlinePolicy)
    with controller:
        run_steps(controller, 30)
    latency_s = log_records(log, "start")[0]["latency_s"]
    online = [r for r in log_records(log, "request") if r.get("online") and r["kernel"] > 0]
    leads_s = np.array([r["due_s"] - r["issued_s"] for r in online])
    assert len(online) > 50 and leads_s.min() >= latency_s - 1e-9
    assert np.median(leads_s) < latency_s + HOLD_MIN_S  # issue-early is 0 here
    assert controller.summary.online.wakes["issue"] > 0  # type: ignore[attr-defined]


def test_the_measured_slowdown_moves_the_policys_budget(tmp_path: Path) -> None:
    controller, _, _ = fake_controller(POLICY, budget=0.01)
    with controller:
        assert controller._parts is not None
        online = controller._parts.source  # the controller's own part under test
        assert isinstance(online, OnlineSteps)
        online.feedback(Interval(0.5, 0.3, 0.7, 2, 0.1 / 12.706))
        assert online.budget == 0.01  # too few pairs: the run's budget
        online.feedback(Interval(1.2, 1.1, 1.3, 10, 0.1 / 2.262))
        over = online.budget
        online.feedback(Interval(0.9, 0.85, 0.95, 10, 0.05 / 2.262))
        under = online.budget
        online.feedback(Interval(5.0, 4.9, 5.1, 10, 0.1 / 2.262))
        assert online.budget == 0.0  # clipped
        online.feedback(Interval(1.02, 0.9, 1.14, 10, 0.12 / 2.262))
        assert online.budget == 0.01  # within a standard error of the budget: the budget
    assert over < 0.01 < under <= 0.02
    assert under == pytest.approx(0.01 + FEEDBACK_GAIN * (0.01 - (0.9 + 0.05 / 2.262) / 100), rel=1e-3)
    assert over == pytest.approx(0.01 + FEEDBACK_GAIN * (0.01 - (1.2 - 0.1 / 2.262) / 100), rel=1e-3)


def test_a_slow_decision_is_budgeted_where_its_request_goes_out(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Decisions that take 1 ms of the (virtual) clock and ask for another pair each time: every online
    request's change is still planned at least one latency after the request left, the hand-over's included
    (the next step's first decision is made that much ahead)."""
    from kdvfs.agents.learned.policy.online import OnlinePolicy

    log = tmp_path / "run.jsonl"
    controller, gpu, timeline = fake_controller(POLICY, log=str(log))
    timeline.anchor_kernels = ANCHOR_KERNELS
    decide, begin, asked = OnlinePolicy.decide, OnlinePolicy.begin, [0]

    def another_pair(self: OnlinePolicy) -> int:
        asked[0] += 1
        return 1 + asked[0] % 2

    def slow_decide(self: OnlinePolicy, *args: Any) -> Any:
        gpu.clock.advance_to(gpu.clock.now_s() + 1e-3)
        return decide(self, *args)._replace(pair=another_pair(self))

    def slow_begin(self: OnlinePolicy, budget: float) -> int:
        gpu.clock.advance_to(gpu.clock.now_s() + 1e-3)
        begin(self, budget)
        return another_pair(self)

    monkeypatch.setattr(OnlinePolicy, "decide", slow_decide)
    monkeypatch.setattr(OnlinePolicy, "begin", slow_begin)
    with controller:
        run_steps(controller, 30)
    latency_s = log_records(log, "start")[0]["latency_s"]
    online = [r for r in log_records(log, "request") if r.get("online") and r["step"] > 2]
    handed_over = [r for r in online if r["kernel"] == 0]
    assert len(online) > len(handed_over) >= 3
    late = [r for r in online if r["due_s"] - r["issued_s"] < latency_s - 1e-9]
    assert not late, [(r["step"], r["kernel"], r["request_s"], r["issued_s"], r["due_s"]) for r in late]


def test_online_changes_are_planned_at_the_pace_of_a_stretch_slow_in_every_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dry run whose steps all idle 1 ms (2% of the step) before anchor 5: the online requests' changes
    before and after that stretch are planned where the GPU starts their kernels (with the step's time stretched
    evenly, up to 1 ms off); inside it, in proportion."""
    from kdvfs.agents.learned.policy.online import OnlinePolicy

    monkeypatch.setattr(anchors_module, "nearest_kernels", lambda starts_s, positions_s: np.array(ANCHOR_KERNELS))
    _alternate_pairs(monkeypatch, OnlinePolicy)
    log = tmp_path / "run.jsonl"
    controller, gpu, timeline = fake_controller(POLICY, log=str(log), dry_run=True)
    timeline.anchor_kernels = ANCHOR_KERNELS
    timeline.late.update({step: (5, 1e-3) for step in range(41)})
    with controller:
        run_steps(controller, 40)
    paces = {r["step"] + 1: seconds(r, "pace") for r in log_records(log, "step")}
    online = [r for r in log_records(log, "request") if r.get("online") and r["kernel"] > 0
              and r["step"] < len(gpu.steps) and paces.get(r["step"]) is not None
              and not ANCHOR_KERNELS[4] <= r["kernel"] < ANCHOR_KERNELS[5]]
    errors_s = np.array([r["due_s"] - gpu.steps[r["step"]].kernel_start_s[r["kernel"]] for r in online])
    after = [r["kernel"] >= ANCHOR_KERNELS[5] for r in online]
    assert len(online) >= 10 and any(after) and not all(after)
    assert np.abs(errors_s).max() < 1e-9



def test_online_decisions_that_set_clocks_learn_the_pace_from_the_steps_at_auto(tmp_path: Path) -> None:
    """Not a dry run: the pace logged after each step is the median of the last 5 matched steps at auto (the A
    windows' and those before control), segment by segment; the controlled steps ran the policy's clocks."""
    _, _, log = _online_run(tmp_path, steps=80, ab_share=0.25)
    steps = log_records(log, "step")
    seen: list[np.ndarray] = []
    checked = 0
    for before, after in itertools.pairwise(steps):
        if after["matched"] and not after["controlled"] and after["anchors_ns"]:
            seen.append(np.diff(np.concatenate([[before["end_s"]], seconds(after, "anchors"), [after["end_s"]]])))
        if len(seen) >= 5:  # the log's nanoseconds: each time within half of one
            assert seconds(after, "pace") == pytest.approx(np.median(seen[-5:], axis=0).tolist(), abs=2e-9)
            checked += 1
    assert checked > 10 and any(r["controlled"] for r in steps)


def _decision_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **options: Any) -> tuple[set[int], list]:
    """A dry run on anchors: the controlled steps that follow another once the pace is learned, and each decision
    point's step and the kernels the GPU had passed then."""
    from kdvfs.agents.learned.policy.online import OnlinePolicy

    log = tmp_path / "run.jsonl"
    controller, gpu, timeline = fake_controller(POLICY, log=str(log), dry_run=True, **options)
    timeline.anchor_kernels = ANCHOR_KERNELS
    decide, points = OnlinePolicy.decide, []

    def noting(self: OnlinePolicy, state: Any, *args: Any) -> Any:
        points.append((len(gpu.steps), gpu.passed_kernels()))  # the running step and the kernels it passed
        return decide(self, state, *args)

    with monkeypatch.context() as patch:
        patch.setattr(OnlinePolicy, "decide", noting)
        with controller:
            run_steps(controller, 40)
    steps = log_records(log, "step")
    paced = {r["step"] + 1 for r in steps if r["pace_ns"]}  # learned before the step's end
    return {r["step"] + 1 for r in steps if r["controlled"] and r["next_controlled"] and r["step"] in paced}, points


def test_the_thread_sleeps_through_the_lead_in_and_decides_only_after_the_first_anchor(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the pace is learned, no decision point of a controlled step that follows another falls before the
    GPU reaches the step's first anchor (kernel 8), by default; without the option, the first comes at the
    step's start."""
    monkeypatch.setattr(anchors_module, "nearest_kernels", lambda starts_s, positions_s: np.array(ANCHOR_KERNELS))
    (tmp_path / "off").mkdir()
    follows, points = _decision_points(tmp_path, monkeypatch)
    assert len(follows) > 10 and min(k for step, k in points if step in follows) >= ANCHOR_KERNELS[0]
    follows, points = _decision_points(tmp_path / "off", monkeypatch, sleep_lead_in=False)
    assert min(k for step, k in points if step in follows) < ANCHOR_KERNELS[0]


def test_a_late_lead_in_is_waited_for_and_the_steps_changes_are_placed_from_its_first_anchor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dry run where every third step's GPU idles 2 ms more before the first anchor (kernel 48, 46 ms into
    the 52 ms step; the switching latency 2 ms) than the learned pace says: the thread, asleep through the
    lead-in (of a controlled step that follows another, and of the first after an A window once its first pair
    is out), waits on until the GPU passed that anchor, so no decision of those steps comes before it and every
    change of theirs is planned where the GPU starts its kernel (decided at the anchor's expected time instead,
    changes were planned from the step's start, 2 ms early)."""
    from kdvfs.agents.learned.policy.online import OnlinePolicy

    anchors = ANCHOR_KERNELS[5:]  # from kernel 48, where kernels are short: a change's request goes out at once
    monkeypatch.setattr(anchors_module, "nearest_kernels", lambda starts_s, positions_s: np.array(anchors))
    _alternate_pairs(monkeypatch, OnlinePolicy)
    late = set(range(12, 40, 3))
    log = tmp_path / "run.jsonl"
    controller, gpu, timeline = fake_controller(POLICY, log=str(log), dry_run=True,
                                                ab_share=0.25)
    timeline.anchor_kernels = anchors
    timeline.late.update({step: (0, 2e-3) for step in late})
    decide, passed = OnlinePolicy.decide, []
    monkeypatch.setattr(OnlinePolicy, "decide", lambda self, *args: (
        passed.append((len(gpu.steps), gpu.passed_kernels())), decide(self, *args))[1])
    with controller:
        run_steps(controller, 40)
    before = {r["step"] + 1: r for r in log_records(log, "step") if r["pace_ns"] and r["next_controlled"]}
    checked = late & set(before)
    assert any(not before[step]["controlled"] for step in checked)  # first controlled steps after an A window
    online = [r for r in log_records(log, "request") if r.get("online") and r["kernel"] > 0 and r["step"] in checked]
    errors_s = np.array([r["due_s"] - gpu.steps[r["step"]].kernel_start_s[r["kernel"]] for r in online])
    assert len(checked) >= 5 and len(online) >= len(checked)
    assert np.abs(errors_s).max() < 1e-9
    assert min(k for step, k in passed if step in checked) >= anchors[0]
    assert controller.summary.lead_in.late >= len(checked)  # type: ignore[attr-defined]


def _decisions_and_warm_ups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **options: Any) -> tuple[list, list]:
    """A dry run's decision records (less their wall times) and each call of the policy's, in order: ("warm", the
    state it warms at) or ("decide", the state it decides at)."""
    from kdvfs.agents.learned.policy.online import OnlinePolicy

    log = tmp_path / "run.jsonl"
    controller, _, timeline = fake_controller(POLICY, log=str(log), dry_run=True, **options)
    timeline.anchor_kernels = ANCHOR_KERNELS
    decide, warm, calls = OnlinePolicy.decide, OnlinePolicy.warm, []

    def deciding(self: OnlinePolicy, state: Any, *args: Any) -> Any:
        calls.append(("decide", state))
        return decide(self, state, *args)

    def warming(self: OnlinePolicy, state: Any) -> None:
        calls.append(("warm", state))
        warm(self, state)

    with monkeypatch.context() as patch:
        patch.setattr(OnlinePolicy, "decide", deciding)
        patch.setattr(OnlinePolicy, "warm", warming)
        with controller:
            run_steps(controller, 30)
    records = [{k: v for k, v in r.items() if k != "wall_us"} for r in log_records(log, "decision")]
    return records, calls[1:]  # after prepare's throwaway decision


def test_a_warm_up_precedes_each_decision_point_and_changes_no_decision(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``online_warm_up`` (the default) every decision point the thread slept to follows a throwaway
    decision at the live state of its moment (after the decision before it in the step, and not after the one it
    warms), and the decisions are the ones made without."""
    (tmp_path / "off").mkdir()
    records, calls = _decisions_and_warm_ups(tmp_path, monkeypatch)
    plain, plain_calls = _decisions_and_warm_ups(tmp_path / "off", monkeypatch, online_warm_up=False)
    assert records == plain and len(records) > 20 and all(kind == "decide" for kind, _ in plain_calls)
    warm_ups = [i for i, (kind, _) in enumerate(calls) if kind == "warm"]
    assert len(warm_ups) > len(records) / 2
    for i in warm_ups[:-1]:  # between two decisions of a step (the last may be cut by the stop)
        (before, last), (warm, state), (after, then) = calls[i - 1:i + 2]
        assert (before, warm, after) == ("decide", "warm", "decide")
        assert last.elapsed_s < state.elapsed_s <= then.elapsed_s and last.kernel <= state.kernel


def test_the_thread_wakes_for_its_work_not_for_the_time_that_passes(tmp_path: Path) -> None:
    """A dry run whose standing orders depend on the budget (re-read every decision interval in the
    environment): at an interval of 0.25 ms or of 2 ms the thread wakes about as often, at most twice per
    decision point (a warm-up, then the point) and a few times per step (its end, its lead-in), not once per
    interval; the summary's host cost adds up, and its requests were on time."""
    wakes = {}
    for interval_ms in (0.25, 2.0):
        controller, _, _ = _online_run(tmp_path, dry_run=True, ab_share=0.25, online_interval_ms=interval_ms)
        summary = controller.summary  # type: ignore[attr-defined]
        cost, online = summary.host_cost, summary.online
        assert online.interval_s == pytest.approx(interval_ms / 1e3) and online.wakes["proposal"] > 0
        assert online.lookahead_points > online.wakes["proposal"]  # read ahead, slept through
        assert cost.wakes <= 2 * sum(online.wakes.values()) + 2 * summary.steps
        assert cost.total_s == pytest.approx(cost.thread_s + cost.energy_thread_s)
        assert cost.per_step_s == pytest.approx(cost.total_s / summary.steps)
        assert summary.requests.planned > 0 and summary.requests.late == 0
        wakes[interval_ms] = cost.wakes_per_step
    assert wakes[0.25] < 1.25 * wakes[2.0]
