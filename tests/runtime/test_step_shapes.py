"""The step-shape probe: the model root found by the first module called, every forward call of each step
recorded (positional and keyword tensors; micro-batches in turn), evaluation passes ignored, a compiled model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from kdvfs.envs.trace.shape import StepShape
from kdvfs.runtime.step_shapes import ShapeProbe


class KeywordModel(nn.Module):
    """Called as HF models are: ``model(input_ids=..., labels=...)``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 4)
        self.head = nn.Linear(4, 16)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.head(self.embed(input_ids))
        return logits.square().mean() if labels is None else nn.functional.cross_entropy(logits.flatten(0, 1),
                                                                                         labels.flatten())


@pytest.fixture
def probe() -> Iterator[ShapeProbe]:
    torch.manual_seed(0)
    installed = ShapeProbe().install()
    yield installed
    installed.remove()


def test_keyword_calls_are_keyed_by_name(probe: ShapeProbe) -> None:
    model = KeywordModel()
    shapes = [(2, 5), (2, 5), (3, 7), (1, 9)]
    for batch, seq in shapes:
        ids = torch.randint(0, 16, (batch, seq))
        model(input_ids=ids, labels=ids).backward()
        probe.mark_step()
    assert probe.root is model
    assert probe.shape_of(0) is None  # the call that found the root passes no keywords to a global hook
    assert [probe.shape_of(step) for step in (1, 2, 3)] == [StepShape.of([s, s]) for s in shapes[1:]]
    assert probe.shape_of(3) == StepShape(((1, 9), (1, 9)))


def test_positional_calls_later_calls_and_evaluation(probe: ShapeProbe) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    seen: list[tuple[int, StepShape]] = []
    probe.on_shape = lambda step, shape: seen.append((step, shape))
    model(torch.zeros(1, 4))  # finds the root; step 0 has no shape
    assert probe.mark_step() == 0
    with torch.no_grad():
        model(torch.zeros(9, 4))  # an evaluation pass: not the step's shape
    model(torch.zeros(3, 4))
    assert probe.current == StepShape.of([(3, 4)])
    model(torch.zeros(5, 4))  # a second micro-batch (gradient accumulation): the step is keyed by both
    assert probe.current == StepShape.of([(3, 4), (5, 4)])
    assert probe.mark_step() == 1
    assert probe.current is None and probe.steps_marked == 2
    assert probe.shape_of(1) == StepShape.of([(3, 4), (5, 4)])
    assert seen == [(1, StepShape.of([(3, 4)])), (1, StepShape.of([(3, 4), (5, 4)]))]
    assert probe.root is model


def test_modules_without_parameters_are_not_the_root(probe: ShapeProbe) -> None:
    preprocess, model = nn.ReLU(), nn.Linear(4, 2)
    for _ in range(2):
        model(preprocess(torch.zeros(2, 4))).sum().backward()
        probe.mark_step()
    assert probe.root is model and probe.shape_of(1) == StepShape.of([(2, 4)])


@pytest.mark.filterwarnings("ignore:Using `torch.compile")
def test_compiled_model_is_hooked_on_its_wrapper(probe: ShapeProbe) -> None:
    compiled = torch.compile(nn.Linear(4, 2), backend="eager")
    for batch in (2, 2, 6):
        compiled(torch.zeros(batch, 4)).sum().backward()
        probe.mark_step()
    assert type(probe.root).__name__ == "OptimizedModule"
    assert [probe.shape_of(step) for step in (1, 2)] == [StepShape.of([(2, 4)]), StepShape.of([(6, 4)])]


def test_attach_history_and_remove() -> None:
    model = nn.Linear(4, 2)
    probe = ShapeProbe(history=2).attach(model)
    for batch in (1, 2, 3):
        model(torch.zeros(batch, 4))
        probe.mark_step()
    assert [probe.shape_of(step) for step in range(3)] == [None, StepShape.of([(2, 4)]), StepShape.of([(3, 4)])]
    probe.remove()
    probe.remove()
    model(torch.zeros(7, 4))
    assert probe.current is None


def test_a_step_is_first_seen_when_a_forward_call_of_it_is_new_to_the_process() -> None:
    model = nn.Linear(4, 2)
    probe = ShapeProbe(history=4).attach(model)
    for micro_batches in ([2], [2], [3], [2, 3], [3, 5], [5]):  # gradient accumulation: a call per micro-batch
        for batch in micro_batches:
            model(torch.zeros(batch, 4))
        probe.mark_step()
    assert [probe.first_seen(step) for step in range(6)] == [None, None, True, False, True, False]  # history 4
    assert probe.first_seen(6) is None


class _Packed(nn.Module):
    """A packed batch's forward: the tokens and, apart, the longest sample's length (a model's kwargs)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, tokens: torch.Tensor, longest: torch.Tensor) -> torch.Tensor:
        return self.linear(tokens)


def test_new_inputs_count_the_inputs_new_at_their_place() -> None:
    """Two new micro-batches count twice; an input that varies alone counts apart from the others; a call new only
    as a combination of known inputs counts none (it is still first seen)."""
    model = _Packed()
    probe = ShapeProbe().attach(model)
    steps = ([(2, 1)], [(2, 1)], [(3, 1), (5, 1)], [(3, 2)], [(5, 1), (3, 3)], [(5, 2)])
    for calls in steps:  # (tokens, longest) per micro-batch
        for tokens, longest in calls:
            model(torch.zeros(tokens, 4), torch.zeros(longest))
        probe.mark_step()
    assert [probe.new_inputs(step) for step in range(6)] == [(1, 1), (0, 0), (2, 0), (0, 1), (0, 1), (0, 0)]
    assert [probe.first_seen(step) for step in range(6)] == [True, False, True, True, True, True]
    assert probe.new_inputs(6) is None


def test_the_call_shapes_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A packed run meets a new shape every step: the probe keeps the most recently run ones only."""
    from kdvfs.runtime import step_shapes

    monkeypatch.setattr(step_shapes, "CALL_SHAPES", 2)
    model = nn.Linear(4, 2)
    probe = ShapeProbe().attach(model)
    for batch in (1, 2, 1, 3, 2, 3, 1):  # 1 was run again, so 3 pushes 2 out; then 2 pushes 1 out
        model(torch.zeros(batch, 4))
        probe.mark_step()
    assert [probe.first_seen(step) for step in range(7)] == [True, True, False, True, True, False, True]
