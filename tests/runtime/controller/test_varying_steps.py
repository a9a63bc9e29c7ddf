"""A run whose steps vary: every step planned by its shape's bucket, on the fake GPU.

The family is the synthetic decoder at several sequence lengths: the generator is then an exact step model,
so these tests check the controller's side (buckets, entries, weights, fallbacks), not the prediction.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.planners.prediction_margin import PredictionMargin
from kdvfs.agents.planners.registry import make_planner
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.step_model import AlignedSteps
from kdvfs.envs.synthetic.generator import generate_transformer_trace, load_workload
from kdvfs.envs.trace.format import save_trace
from kdvfs.envs.trace.shape import StepShape
from kdvfs.envs.trace.trace import Trace
from kdvfs.runtime.cli.offline.plan import schedule_json
from kdvfs.runtime.controller import Controller
from kdvfs.runtime.controller.shapes import steps
from kdvfs.runtime.controller.shapes.book import ShapeBook, ShapePlan, seq_quantum
from kdvfs.runtime.controller.shapes.steps import NewInputs, VaryingSteps
from kdvfs.runtime.testing.fake_gpu import FakeGpu, FakeStepTimeline, VirtualClock
from tests.runtime.summaries import checked

BATCH = 2
SEQS = (128, 192, 256)
BUDGET = 0.01
LATENCY_MS = 2.0


def shape(seq: int) -> StepShape:
    return StepShape.of([(BATCH, seq)] * 2)


@cache
def step(seq: int) -> Trace:
    """The synthetic 2-layer GPT-2-small step of ``seq`` tokens per sequence on the H200."""
    config = replace(load_workload("gpt2s"), layers=2, seq=seq, batch=BATCH, name=f"gpt2s-l2-s{seq}")
    trace = generate_transformer_trace(config, load_profile("h200"))
    return replace(trace, meta=replace(trace.meta, step_shape=shape(seq)))


def predict(wanted: StepShape) -> Trace | None:
    """The exact step of a shape within 64..512 tokens (the generator is this family's true step model)."""
    return step(wanted.seq) if wanted.batch == BATCH and 64 <= wanted.seq <= 512 else None


@cache
def problem(seq: int) -> Problem:
    """The step of ``seq`` tokens priced once (a frozen problem; the fake GPU only reads its costs)."""
    return Problem.build(step(seq), load_profile("h200"), BUDGET, LATENCY_MS / 1e3)


def varying_controller(tmp_path: Path, seqs: list[int], policy: str | None = None, online: bool = False,
                       new_inputs: NewInputs | None = None, ab_share: float = 0.0) -> tuple[Controller, FakeGpu]:
    """A controller on a fake H200 whose step ``i`` has ``seqs[i]`` tokens per sequence; its trace is the
    256-token step's, its plan that step's latency-optimal plan, or ``policy`` (deciding online with ``online``,
    else its rollouts replayed); ``new_inputs``: a step's inputs of a new shape (None: one when its whole shape is
    new)."""
    reference = problem(256)
    trace_path = tmp_path / "step.trace.json"
    save_trace(reference.trace, trace_path)
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(schedule_json(reference, make_planner("latency-optimal").plan(reference))))
    source = str(plan_path) if policy is None else policy
    clock = VirtualClock()
    gpu = FakeGpu(reference.costs, reference.profile, reference.latency_s, reference.stall_s, clock)
    timeline = FakeStepTimeline(gpu, clock)
    for i, seq in enumerate(seqs):
        gpu.step_costs[i], timeline.shapes[i] = problem(seq).costs, shape(seq)
    varying = VaryingSteps([shape(s) for s in SEQS], predict, timeline.shape_of, new_inputs)
    controller = Controller(source, str(trace_path), device=gpu, timeline=timeline, clock=clock,
                            varying=varying, online=online, latency_ms=LATENCY_MS, budget=BUDGET, window_steps=5,
                            window_s=0.1, energy_read_every_s=0.0, issue_early_ms=0.0, ab_share=ab_share,
                            log=str(tmp_path / "run.jsonl"))
    return controller, gpu


def run(controller: Controller, steps: int) -> None:
    """Run ``steps`` steps (the fake timeline knows one shape more: the step each last one decides)."""
    with controller:
        for _ in range(steps):
            controller.step()
            controller.flush()


def test_the_quantum_keeps_the_range_within_the_bucket_limit() -> None:
    assert seq_quantum([64, 1024]) == 64
    assert seq_quantum([100, 120]) == 16
    assert seq_quantum([]) == 16


def test_buckets_cover_the_captured_range_and_round_up() -> None:
    book = ShapeBook.build([shape(128), shape(256)], predict, load_profile("h200"), BUDGET, LATENCY_MS / 1e3,
                           workers=1)
    assert book.quantum == 16
    assert sorted(top.seq for top in book.plans) == list(range(128, 257, 16))
    assert book.bucket(shape(129)) == shape(144) and book.plan_for(shape(129)) is book.plans[shape(144)][0]
    assert book.plan_for(shape(600)) is None and book.plan_for(StepShape.of([(3, 128)])) is None


def test_the_buckets_are_planned_at_the_prediction_margin() -> None:
    book = ShapeBook.build([shape(128), shape(256)], predict, load_profile("h200"), BUDGET, LATENCY_MS / 1e3,
                           workers=1, prediction_margin=0.8)
    assert book.margins == pytest.approx((0.8, 0.4))
    for plans in book.plans.values():
        assert [plan.problem.budget for plan in plans] == pytest.approx([BUDGET * 0.8, BUDGET * 0.4])


def test_varying_steps_plan_at_their_references_margin_and_say_so(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    built: dict[str, object] = {}
    monkeypatch.setattr(steps, "prediction_margin", lambda *args: PredictionMargin(0.8, (0.9, 1.25)))
    monkeypatch.setattr(ShapeBook, "build", lambda *args, **kwargs: built.update(kwargs))
    varying = VaryingSteps([shape(128), shape(256)], predict, lambda step, deadline_s: None,
                           references=AlignedSteps((), (), ()))  # what the margin is found from: patched above
    varying.plan(problem(128), make_planner("latency-optimal"))
    assert built["prediction_margin"] == 0.8
    assert "planned at 80% of the budget (the prediction margin)" in capsys.readouterr().err


def test_every_step_runs_its_buckets_plan_and_keeps_the_budget(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    seqs = [int(s) for s in rng.choice(SEQS, 40)]
    controller, gpu = varying_controller(tmp_path, seqs)
    run(controller, len(seqs) - 1)
    summary = checked(controller.summary)
    assert summary.shapes is not None and summary.shapes.misses == {}
    assert summary.controlled_steps >= len(seqs) - 5  # all but the first steps, which confirm the match
    assert sum(summary.shapes.steps_by_bucket.values()) == len(seqs) - 1  # each decided step's entry
    for i, fake in enumerate(gpu.steps[4:], start=4):
        auto = problem(seqs[i]).costs
        auto_s = float(auto.time_s[:, auto.auto_index].sum())
        assert fake.model_time_s <= auto_s * (1 + BUDGET) + 2 * gpu.stall_s + 1e-9  # each step within budget
    assert summary.gpu_restored


def test_a_step_longer_than_every_plan_runs_at_auto_and_is_counted(tmp_path: Path) -> None:
    """Outside the step model's range: no plan, none planned later, none at least as long to stand in."""
    seqs = [256] * 6 + [700] + [256] * 6
    controller, gpu = varying_controller(tmp_path, seqs)
    run(controller, len(seqs) - 1)
    summary = controller.summary
    assert summary is not None and summary.shapes.misses == {"no_plan": 1}
    assert summary.shapes.planned_in_background == 0
    odd_step = gpu.steps[6]
    to_auto = [call for call in gpu.set_calls if call.name == "reset_clocks" or call.args[0] is None]
    assert any(odd_step.start_s - 1e-9 <= call.time_s <= odd_step.end_s for call in to_auto)  # auto requested
    assert summary.controlled_steps >= len(seqs) - 7  # control resumes once the steps after it confirm
    assert summary.auto_reasons["no_plan"] >= 1


def test_a_new_bucket_runs_a_longer_plan_at_the_safety_margin_until_its_own_is_planned(tmp_path: Path) -> None:
    """64 tokens lies below the planned range (128-256): its first step runs the 128 bucket's plan at the
    smallest margin, and the book plans its bucket in the background for the steps after."""
    seqs = [256] * 4 + [64] + [256] * 3 + [64] * 3
    controller, _ = varying_controller(tmp_path, seqs)
    with controller:
        for i in range(len(seqs) - 1):
            controller.step()
            controller.flush()
            if i == 4:  # the first 64-token step was decided: wait for its bucket's plans
                assert controller.book is not None
                controller.book.settle()
    summary = controller.summary
    assert summary is not None and summary.shapes.misses == {}
    assert summary.shapes.stood_in >= 1 and summary.shapes.planned_in_background == 1
    assert summary.shapes.steps_by_bucket.get(shape(64).key, 0) >= 2  # its own plan, once in
    log = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    planned = [r for r in log if r["event"] == "bucket_planned"]  # when, to set beside the steps' times
    assert [r["bucket"] for r in planned] == [shape(64).key] and planned[0]["end_s"] > 0 < planned[0]["solve_s"]


def test_a_policy_plans_every_bucket_by_its_rollout(tmp_path: Path) -> None:
    controller, _ = varying_controller(tmp_path, [128, 256, 192] * 4, policy="h200")
    run(controller, 11)
    summary = controller.summary
    assert summary is not None and summary.shapes.buckets == 9 and summary.controlled_steps > 0
    assert controller.book is not None  # its schedules are the policy's rollouts
    assert {plan.schedule.method for plans in controller.book.plans.values() for plan in plans} == {"policy"}
    assert summary.source == "policy h200.kdvfs-policy.npz (replayed, 3 buckets)" and summary.online is None


def test_a_policy_decides_online_in_the_steps_of_every_bucket(tmp_path: Path) -> None:
    """With ``online`` each bucket's policy, prepared on the book's thread, decides through its steps (not its
    rollout replayed), and the summary says so."""
    seqs = [128, 256, 192] * 6
    controller, gpu = varying_controller(tmp_path, seqs, policy="h200", online=True)
    with controller:
        assert controller.book is not None
        controller.book.settle()  # every bucket's policy prepared before the first step
        for _ in range(len(seqs) - 1):
            controller.step()
            controller.flush()
    summary = checked(controller.summary)
    assert summary.online is not None and summary.shapes is not None and summary.controlled_steps > 10
    decided = summary.online.steps_by_bucket
    assert set(decided) == {shape(s).key for s in SEQS} and sum(decided.values()) >= summary.controlled_steps
    assert summary.shapes.replayed_steps_by_bucket == {} and summary.online.decisions > 0
    assert summary.source == "policy h200.kdvfs-policy.npz (online, 3 buckets)"
    assert summary.online.requests > 0 and gpu.set_calls  # the clocks it requested


def _capture_set(folder: Path, traces: list[Trace]) -> Path:
    """``traces`` saved as one capture's trace set (same shape distribution, ``.shape-K`` siblings) in a new
    folder under ``folder``."""
    folder = folder / f"capture-{len(list(folder.iterdir()))}"
    folder.mkdir()
    distribution = tuple((t.meta.step_shape, 1) for t in traces if t.meta.step_shape is not None)
    paths = [folder / "run.trace.json", *(folder / f"run.shape-{k}.trace.json" for k in range(1, len(traces)))]
    for trace, path in zip(traces, paths, strict=True):
        save_trace(replace(trace, meta=replace(trace.meta, shape_distribution=distribution)), path)
    return paths[0]


def test_a_capture_of_several_shapes_makes_the_run_vary_and_one_shape_does_not(tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture[str]
                                                                               ) -> None:
    from kdvfs.runtime.controller.shapes.varying import varying_steps
    from kdvfs.runtime.device.host_time import RealClock

    assert varying_steps(str(_capture_set(tmp_path, [step(128)])), RealClock()) is None
    found = varying_steps(str(_capture_set(tmp_path, [step(128), step(256), step(192)])), RealClock())
    assert found is not None and sorted(s.seq for s in found[0].shapes) == [128, 192, 256]
    assert found[0].predict(shape(160)) is not None and found[0].predict(shape(4096)) is None
    assert found[0].step_model_basis == "attention"  # 3 shapes of one length: too few for the quadratic basis
    images = replace(step(192), meta=replace(step(192).meta, step_shape=StepShape.of([(BATCH, 3, 32, 32)])))
    assert varying_steps(str(_capture_set(tmp_path, [step(128), images])), RealClock()) is None
    assert "no step model fits" in capsys.readouterr().err


def two_lengths(source: int, target: int) -> StepShape:
    return StepShape.of([(BATCH, source), (BATCH, target), (BATCH, source), (BATCH, target)])


def test_two_lengths_are_bucketed_each_and_a_new_bucket_is_planned_in_the_background() -> None:
    """An encoder-decoder's input and label lengths: each rounded to its own quantum; a bucket met first is
    stood in for by the smallest planned one at least as long in both, then planned on the book's pool: predicted,
    priced and solved in its worker processes, never in the training process."""
    predicted_here: list[StepShape] = []  # the workers' appends stay in their own processes

    def predict_two(wanted: StepShape) -> Trace | None:
        predicted_here.append(wanted)
        source, target = wanted.inputs[0][1], wanted.inputs[1][1]
        return step(source + target) if source + target <= 512 else None

    seen = [two_lengths(s, t) for s, t in ((128, 32), (256, 96), (192, 64), (130, 100))]
    book = ShapeBook.build(seen, predict_two, load_profile("h200"), BUDGET, LATENCY_MS / 1e3, workers=1)
    try:
        assert book.quanta == (32, 16) and book.bucket(two_lengths(129, 33)) == two_lengths(160, 48)
        assert set(book.plans) == {book.bucket(s) for s in seen}  # two classes: no range filled in advance
        new = book.bucket(two_lengths(150, 40))
        assert new not in book.plans
        assert book.stand_in(new, book.plans) == two_lengths(192, 64)  # the smallest at least as long in both
        assert book.stand_in(book.bucket(two_lengths(300, 10)), book.plans) is None
        planned: list[StepShape] = []
        book.on_plan = lambda top, plans, solve_s: planned.append(top)
        book.request(new)
        book.request(new)  # once
        book.settle()
        assert planned == [new] and book.planned_later == 1 and len(book.plans[new]) == len(book.margins)
        assert book.plans[new][1].problem.budget == BUDGET * book.margins[1] and predicted_here == []
        prepared: list[StepShape] = []

        def prepare(top: StepShape, plans: tuple[ShapePlan, ...]) -> None:
            if len(prepared) == 2:
                raise RuntimeError("no policy")
            prepared.append(top)

        book.prepare_buckets(prepare)  # every planned bucket, on the book's thread, until one fails
        book.settle()
        assert len(prepared) == 2 and book.plan_error == "RuntimeError: no policy"
        book.request(book.bucket(two_lengths(140, 20)))  # background work has ended: nothing more is planned
        book.settle()
        assert book.planned_later == 1
    finally:
        book.close()


def test_a_step_with_gradient_accumulation_is_decided_on_all_its_micro_batches() -> None:
    """The controller's thread waits past the first micro-batch for the step's last one (or its end)."""
    import threading

    import torch

    from kdvfs.runtime.controller.shapes.varying import StepShapes
    from kdvfs.runtime.device.host_time import RealClock

    model = torch.nn.Linear(4, 2)
    shapes = StepShapes(RealClock(), inputs=2)
    shapes.probe.attach(model)
    got: list[StepShape | None] = []
    waiter = threading.Thread(target=lambda: got.append(shapes.shape_of(0, RealClock().now_s() + 60.0)))
    model(torch.zeros(3, 4))
    waiter.start()
    model(torch.zeros(5, 4))  # the second micro-batch completes the step's shape
    waiter.join()
    assert got == [StepShape.of([(3, 4), (5, 4)])]
    shapes.mark_step()
    model(torch.zeros(3, 4))
    shapes.mark_step()  # a step that ended after one micro-batch gives what it had
    assert shapes.shape_of(1, 0.0) == StepShape.of([(3, 4)])


def test_the_source_names_the_buckets_a_policy_decided_online_in_and_those_it_replayed() -> None:
    from kdvfs.envs.model.schedule import Schedule
    from kdvfs.runtime.controller.control.summary import source_that_ran
    from kdvfs.runtime.controller.model.plan import Plan
    from kdvfs.runtime.controller.model.run_summary import OnlineFigures, Quantiles, ShapeFigures

    none = Quantiles(None, None)

    def ran(online: dict[str, int] | None, replayed: dict[str, int]) -> str:
        figures = None if online is None else OnlineFigures(0, 0, 0, 0, 0, {}, {}, none, none, none, 0.0, None, None,
                                                            {}, 0.01, 0.001, online)
        shapes = ShapeFigures(3, 16, [16], [1.0, 0.5], 1.0, 0, 1.0, 0, None, 0, {}, replayed, {}, "quadratic")
        plan = Plan(problem(128), Schedule(np.zeros(3, dtype=np.int64), "policy", 0.0), "policy p.npz (replayed)",
                    None, "p.npz")
        return source_that_ran(plan, figures, shapes)

    assert ran({"a": 4, "b": 1}, {"c": 2}) == "policy p.npz (online, 2 buckets; replayed, 1 bucket)"
    assert ran(None, {"a": 1, "b": 2}) == "policy p.npz (replayed, 2 buckets)"
    assert ran({}, {}) == "policy p.npz (replayed, 0 buckets)"  # nothing controlled: what it was set to run


def test_a_controller_told_not_to_look_for_varying_steps_leaves_its_captures_unread(tmp_path: Path) -> None:
    """The controller process (training/controller_process.py) looks for them itself before it opens the
    controller; told so, the controller does not load the captures a second time."""
    reference = problem(256)
    trace_path = _capture_set(tmp_path, [step(256), step(128), step(192)])
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(schedule_json(reference, make_planner("latency-optimal").plan(reference))))
    books = []
    for look in (False, True):
        clock = VirtualClock()
        gpu = FakeGpu(reference.costs, reference.profile, reference.latency_s, reference.stall_s, clock)
        controller = Controller(str(plan_path), str(trace_path), device=gpu, timeline=FakeStepTimeline(gpu, clock),
                                clock=clock, look_for_varying=look, latency_ms=LATENCY_MS, budget=BUDGET,
                                energy_read_every_s=0.0, ab_share=0.0)
        with controller:
            books.append(controller.book)
    assert books[0] is None and books[1] is not None


@pytest.mark.parametrize("told", [None, (0, 0), (2, 1)])
def test_a_windows_new_inputs_are_the_probes_count(tmp_path: Path, told: tuple[int, ...] | None) -> None:
    """With gradient accumulation nearly every step's whole shape is new while its micro-batches' shapes are not:
    the A/B windows' ``new_inputs`` covariate is the steps' mean count of inputs new to the process by position, as
    the probe counts them (without the probe's count, one position: one for a step whose whole shape is new)."""
    seqs = [128, 192, 256] * 60
    controller, _ = varying_controller(tmp_path, seqs, new_inputs=None if told is None else (lambda step: told),
                                       ab_share=0.5)
    run(controller, len(seqs) - 1)
    counts = [w["new_inputs"] for w in controller.windows if w["new_inputs"] is not None]
    assert counts
    if told is None:
        assert max(c for (c,) in counts) < 0.1  # the first step of each shape only
    else:
        assert set(counts) == {tuple(map(float, told))}
