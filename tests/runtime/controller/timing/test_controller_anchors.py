"""Anchors inside the step: the hooks that record them, the stream they record on, the learned anchor map, and
requests placed on anchors by the controller on the fake GPU, with the step-level timeline as the fallback for
anchors that are missing, late, disordered or out of place."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from kdvfs.runtime.controller.event_log import seconds
from kdvfs.runtime.controller.timing import anchors, gpu_timeline
from kdvfs.runtime.controller.timing.anchor_hooks import AnchorHooks, find_blocks
from kdvfs.runtime.controller.timing.anchors import AnchorMap, nearest_kernels
from kdvfs.runtime.controller.timing.pace import host_offsets_s
from tests.runtime.controller_helpers import LATENCY_MS, fake_controller, log_records, run_steps, write_plan

LATENCY_S = LATENCY_MS / 1e3
ANCHOR_KERNELS = tuple(range(1, 115, 4))


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_plan(tmp_path_factory.mktemp("plan") / "plan.json")


class Net(nn.Module):
    """Input layer, three blocks (each a Sequential: not themselves split), output layer."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(4, 4), nn.Linear(4, 1)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x).sum()


def test_blocks_are_the_outermost_containers_elements() -> None:
    net = Net()
    assert find_blocks(net) == list(net.blocks)
    assert find_blocks(nn.Sequential(net.inp, net.out)) == [net.inp, net.out]
    assert find_blocks(nn.Linear(2, 2)) == []


def test_hooks_anchor_each_block_forward_and_backward_and_the_optimizer_step() -> None:
    net, records = Net(), []
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    global_hooks = len(torch.nn.modules.module._global_forward_pre_hooks)
    hooks = AnchorHooks(lambda: records.append(threading.current_thread().name))
    hooks.install()
    try:
        for _ in range(2):
            records.clear()
            net(torch.ones(2, 4)).backward()
            optimizer.step()
            assert len(records) == 3 + 3 + 1 and hooks.blocks == 3
        assert len(torch.nn.modules.module._global_forward_pre_hooks) == global_hooks  # discovery is over
        records.clear()
        with torch.no_grad():
            net(torch.ones(2, 4))
        assert len(records) == 3
    finally:
        hooks.remove()
    records.clear()
    net(torch.ones(2, 4)).backward()
    optimizer.step()
    assert records == []


@pytest.mark.parametrize(("every", "hooked"), [(1, [0, 1, 2]), (2, [0, 2]), (3, [0]), (5, [0])])
def test_anchors_at_every_nth_block_hook_those_blocks_forward_and_backward(every: int, hooked: list[int]) -> None:
    net, records = Net(), []
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for index, block in enumerate(net.blocks):  # which block's forward runs, in order
        block.register_forward_pre_hook(lambda module, args, index=index: records.append(f"block {index}"))
    hooks = AnchorHooks(lambda: records.append("anchor"), every=every)
    hooks.install()
    try:
        net(torch.ones(2, 4)).backward()
        optimizer.step()
        assert hooks.blocks == 3 and records.count("anchor") == 2 * len(hooked) + 1  # forward, backward, optimizer
        records.clear()
        with torch.no_grad():  # the forward's anchors alone: each right after its block's start
            net(torch.ones(2, 4))
    finally:
        hooks.remove()
    assert [records[i - 1] for i, r in enumerate(records) if r == "anchor"] == [f"block {i}" for i in hooked]


class FakeStream:
    def __init__(self, stream_id: int, device_index: int, device_type: int) -> None:
        self.key = (stream_id, device_index, device_type)


def test_current_stream_keeps_one_object_per_stream_of_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    current = {"stream": (7, 0, 1)}
    monkeypatch.setattr(gpu_timeline, "_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentStream", lambda device: current["stream"], raising=False)
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    first = gpu_timeline.current_stream()
    assert first.key == (7, 0, 1) and gpu_timeline.current_stream() is first
    current["stream"] = (9, 0, 1)  # e.g. inside `with torch.cuda.stream(s)`
    other = gpu_timeline.current_stream()
    assert other.key == (9, 0, 1) and other is not first
    current["stream"] = (7, 0, 1)
    assert gpu_timeline.current_stream() is first


def test_anchor_map_learns_positions_and_their_kernels() -> None:
    starts_s = np.linspace(0.0, 0.1, 101)  # a kernel every millisecond
    anchor_map = AnchorMap(starts_s, expected_s=0.1, learn_steps=3)
    rng = np.random.default_rng(0)
    for step in range(3):
        assert not anchor_map.anchors
        scale = 1.0 + 0.02 * step  # a longer step stretches its anchors alike
        times_s = scale * (np.array([0.0102, 0.0398, 0.0701]) + rng.normal(0, 1e-5, 3))
        assert anchor_map.observe(5.0, 5.0 + scale * 0.1, 5.0 + times_s) == (step == 2)
    assert [a.kernel for a in anchor_map.anchors] == [10, 40, 70]
    assert [a.position_s for a in anchor_map.anchors] == pytest.approx([0.01, 0.04, 0.07])
    assert anchor_map.pick(0.05).kernel == 40 and anchor_map.pick(0.04).kernel == 40  # type: ignore[union-attr]
    assert anchor_map.pick(0.005) is None
    assert nearest_kernels(starts_s, np.array([0.0004, 0.0006, 0.2])).tolist() == [0, 1, 100]


def _numpys_nearest(starts_s: np.ndarray, positions_s: np.ndarray) -> np.ndarray:
    """The nearest kernels as numpy finds them (what the compiled search replaced)."""
    if len(starts_s) < 2:
        return np.zeros(len(positions_s), dtype=np.int64)
    right = np.clip(np.searchsorted(starts_s, positions_s), 1, len(starts_s) - 1)
    left = right - 1
    return np.where(positions_s - starts_s[left] <= starts_s[right] - positions_s, left, right)


@settings(deadline=None)  # the first call loads the compiled search
@given(st.lists(st.floats(-1.0, 1.0), max_size=40), st.lists(
    st.floats(allow_nan=True, allow_infinity=True) | st.floats(-1.1, 1.1), max_size=20))
def test_nearest_kernels_are_numpys(starts: list[float], positions: list[float]) -> None:
    starts_s, positions_s = np.sort(np.array(starts, dtype=float)), np.array(positions, dtype=float)
    assert np.array_equal(nearest_kernels(starts_s, positions_s), _numpys_nearest(starts_s, positions_s))


def test_anchor_map_drops_on_another_count_and_ignores_disorder() -> None:
    anchor_map = AnchorMap(np.linspace(0.0, 0.1, 101), expected_s=0.1, learn_steps=2)
    for _ in range(2):
        anchor_map.observe(0.0, 0.1, [0.01, 0.05])
    assert len(anchor_map.anchors) == 2
    assert not anchor_map.observe(0.0, 0.1, [0.05, 0.01]) and len(anchor_map.anchors) == 2  # disordered: ignored
    assert not anchor_map.observe(0.0, 0.1, [0.01, 0.2]) and len(anchor_map.anchors) == 2  # after the step's end
    assert anchor_map.observe(0.0, 0.1, [0.01, 0.03, 0.05]) and anchor_map.anchors == ()  # another structure
    assert anchor_map.observe(0.0, 0.1, [0.01, 0.03, 0.05]) and len(anchor_map.anchors) == 3


def _anchored_run(plan_file: Path, tmp_path: Path, steps: int, **options: Any) -> tuple[Any, Any, list[Any]]:
    """A dry run with anchors every 4th kernel; the controller, its timeline (set up by ``options['setup']``)
    and the logged requests of anchored steps."""
    setup = options.pop("setup", lambda timeline: None)
    controller, _, timeline = fake_controller(plan_file, dry_run=True, log=str(tmp_path / "log.jsonl"), **options)
    timeline.anchor_kernels = ANCHOR_KERNELS
    setup(timeline)
    with controller:
        run_steps(controller, steps)
    return controller, timeline, log_records(tmp_path / "log.jsonl", "request")


def _starts_and_paces(folder: Path) -> tuple[dict[int, float], dict[int, list[float] | None]]:
    """Each step's start (host s) and the pace its requests were placed at, from the log."""
    steps = log_records(folder / "log.jsonl", "step")
    return {r["step"] + 1: r["end_s"] for r in steps}, {r["step"] + 1: seconds(r, "pace") for r in steps}


def _paced_s(plan: Any, pace_s: list[float] | None, times_s: list[float]) -> np.ndarray:
    """``times_s`` on the plan's timeline at the step's pace with the fake timeline's anchors (the fake GPU runs
    at the plan's times: without a pace, no scale)."""
    if pace_s is None or len(pace_s) != len(ANCHOR_KERNELS) + 1:
        return np.asarray(times_s)
    knots_s = np.concatenate([[0.0], plan.kernel_start_s[list(ANCHOR_KERNELS)], [plan.expected_s]])
    return host_offsets_s(np.array(pace_s), knots_s, times_s)


def test_requests_are_placed_on_anchors_one_latency_ahead(plan_file: Path, tmp_path: Path) -> None:
    controller, _, requests = _anchored_run(plan_file, tmp_path, 16)
    anchored = [r for r in requests if r["anchor"] is not None]
    assert len(anchored) >= 10 and controller.summary.anchors.learned == len(ANCHOR_KERNELS)
    plan = controller.step_plan
    starts, paces = _starts_and_paces(tmp_path)
    assert sum(paces[r["step"]] is not None for r in anchored) >= 5
    for record in anchored:
        change = list(plan.kernels).index(record["kernel"])
        assert record["anchor_kernel"] in ANCHOR_KERNELS
        position_s = plan.kernel_start_s[record["anchor_kernel"]]
        due_s, at_s = _paced_s(plan, paces[record["step"]], [plan.due_s[change], position_s])
        assert record["due_s"] - record["anchor_s"] == pytest.approx(due_s - at_s, abs=1e-9)
        assert record["anchor_s"] <= record["due_s"] - LATENCY_S - 2e-3 + 1e-9  # the margin before issuing
        assert record["issued_s"] == pytest.approx(record["due_s"] - LATENCY_S, abs=1e-9)
        # the fake's anchors sit at the start of the idle gap before their kernel, the map at the kernel's start
        assert record["due_s"] - starts[record["step"]] == pytest.approx(plan.due_s[change], abs=2e-5)


def test_a_late_step_moves_the_changes_after_its_late_anchors(plan_file: Path, tmp_path: Path) -> None:
    delay_s = 0.001
    setup = lambda timeline: timeline.late.__setitem__(12, (8, delay_s))  # noqa: E731
    controller, _, requests = _anchored_run(plan_file, tmp_path, 16, setup=setup)
    starts = {r["step"] + 1: r["end_s"] for r in log_records(tmp_path / "log.jsonl", "step")}
    plan = controller.step_plan
    step_12 = [r for r in requests if r["step"] == 12]
    assert step_12 and all(r["anchor"] is not None for r in step_12)
    for record in step_12:
        planned_s = starts[12] + plan.due_s[list(plan.kernels).index(record["kernel"])]
        late = record["anchor"] >= 8
        assert record["due_s"] - planned_s == pytest.approx(delay_s if late else 0.0, abs=2e-5)  # gaps: see above
    assert any(r["anchor"] >= 8 for r in step_12) and any(r["anchor"] < 8 for r in step_12)


def test_a_stretch_slow_in_every_step_delays_the_changes_after_it_by_as_much(
        plan_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the anchors stand for their kernels (as the trace's structure gives them on a real model: mapped by time,
    # the fake's kernels a few microseconds apart are mis-mapped once the step stretches unevenly)
    monkeypatch.setattr(anchors, "nearest_kernels", lambda starts_s, positions_s: np.array(ANCHOR_KERNELS))
    delay_s = 0.001  # 2% of the step, before anchor 8 (kernel 33); the changes are at kernels 36 and 38
    setup = lambda timeline: timeline.late.update({step: (8, delay_s) for step in range(17)})  # noqa: E731
    controller, _, requests = _anchored_run(plan_file, tmp_path, 16, setup=setup)
    starts, paces = _starts_and_paces(tmp_path)
    plan = controller.step_plan
    paced = [r for r in requests if paces[r["step"]] is not None]
    assert len(paced) >= 10 and sum(r["anchor"] is not None and r["anchor"] < 8 for r in paced) >= 5
    for record in paced:  # those placed before the stretch: ~0.5 ms late if it were spread evenly
        planned_s = starts[record["step"]] + plan.due_s[list(plan.kernels).index(record["kernel"])]
        assert record["due_s"] - planned_s == pytest.approx(delay_s, abs=2e-5)  # gaps: see above


def test_missing_disordered_or_misplaced_anchors_fall_back_to_the_step(plan_file: Path, tmp_path: Path) -> None:
    def setup(timeline: Any) -> None:
        costs = timeline.gpu.costs
        durations_s = costs.time_s[:, costs.auto_index]
        offsets_s = tuple(float(np.sum(durations_s[:k])) for k in ANCHOR_KERNELS)
        timeline.anchors[11] = tuple(reversed(offsets_s))  # out of order (a step the map does not learn from)
        timeline.anchors[12] = tuple(o + 0.02 for o in offsets_s)  # 40% of the step late (nor from this one)
        timeline.anchors[13] = offsets_s[:3]  # the rest never fire: the map is learned again, over steps 14-18

    controller, _, requests = _anchored_run(plan_file, tmp_path, 20, setup=setup)
    starts, paces = _starts_and_paces(tmp_path)
    plan = controller.step_plan
    for record in (r for r in requests if 11 <= r["step"] <= 18):
        assert record["anchor"] is None
        change = list(plan.kernels).index(record["kernel"])
        due_s = _paced_s(plan, paces[record["step"]], [plan.due_s[change]])[0]
        assert record["due_s"] == pytest.approx(starts[record["step"]] + due_s, abs=1e-9)
    assert paces[12] is not None and paces[14] is None  # learned again with the map
    figures = controller.summary.anchors
    assert figures.rejected == 2 * 2 and figures.missing == 2 and figures.step_level >= 2 * 5
    assert [r["anchor"] is not None for r in requests if r["step"] in (10, 19)] == [True] * 4


def test_mismatch_still_returns_to_auto_with_anchors(plan_file: Path, tmp_path: Path) -> None:
    controller, gpu, timeline = fake_controller(plan_file, log=str(tmp_path / "log.jsonl"))
    timeline.anchor_kernels = ANCHOR_KERNELS
    timeline.irregular[12] = (0.3, 999)  # an evaluation pass between two optimizer steps
    with controller:
        run_steps(controller, 22)
    summary = controller.summary
    assert summary is not None and summary.mismatches == 1 and summary.anchors.anchored > 0
    assert np.all(gpu.steps[14].applied == gpu.costs.auto_index)
    assert not np.all(gpu.steps[16].applied == gpu.costs.auto_index)


def test_anchors_off_keeps_the_step_level_timeline(plan_file: Path, tmp_path: Path) -> None:
    controller, _, requests = _anchored_run(plan_file, tmp_path, 12, anchors=False)
    assert requests and all(r["anchor"] is None for r in requests)
    assert controller.summary.anchors.anchored == 0


def test_requests_go_out_early_by_the_wake_up_allowance(plan_file: Path, tmp_path: Path) -> None:
    _, _, requests = _anchored_run(plan_file, tmp_path, 12, issue_early_ms=0.5)
    steady = [r for r in requests if r["step"] > 7]
    assert steady and all(r["issued_s"] == pytest.approx(r["due_s"] - LATENCY_S - 0.5e-3, abs=1e-9) for r in steady)
    assert all(r["request_s"] == pytest.approx(r["due_s"] - LATENCY_S, abs=1e-9) for r in steady)


class LateEvent:
    """An event the GPU passes at its ``done_after``-th query."""

    def __init__(self, done_after: int) -> None:
        self.queries, self.done_after = 0, done_after

    def query(self) -> bool:
        self.queries += 1
        return self.queries >= self.done_after


def test_waiting_for_an_event_polls_it_and_sleeps_in_between() -> None:
    sleeps: list[float] = []
    event = LateEvent(done_after=4)
    gpu_timeline.wait_for(event.query, sleep=sleeps.append)
    assert event.queries == 4 and sleeps == [gpu_timeline.POLL_S] * 3
    sleeps.clear()
    gpu_timeline.wait_for(LateEvent(done_after=1).query, sleep=sleeps.append)
    assert sleeps == []
