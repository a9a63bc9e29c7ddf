"""The prediction margin: set from the references alone, the budget over their worst held-out slowdown, 1
without evidence; an exact prediction leaves no overrun."""

from __future__ import annotations

import pytest

from kdvfs.agents.common.problem import within_budget
from kdvfs.agents.planners.prediction_margin import PredictionMargin, held_out_slowdown_pct, prediction_margin
from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.step_model import AlignedSteps
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.trace import Trace

WORKLOADS = REPO_ROOT / "data" / "traces" / "h200" / "workloads"
BUDGET = 0.01


@pytest.fixture(scope="module")
def references() -> list[Trace]:
    return [load_trace(WORKLOADS / f"bert-{s}.trace.json.gz") for s in ("b32-s128", "b32-s256", "b32-s512")]


def _margin(references: list[Trace], latency_s: float | None, workers: int | None = None) -> PredictionMargin:
    return prediction_margin(AlignedSteps.of(references), load_profile("h200"), BUDGET, latency_s, workers)


def test_the_margin_is_the_budget_over_the_worst_held_out_slowdown(references: list[Trace]) -> None:
    margin = _margin(references, 0.0)
    assert margin.slowdowns_pct  # the middle shape is covered by the other two
    worst = max(margin.slowdowns_pct)
    assert margin.margin == pytest.approx(min(1.0, 100 * BUDGET / worst) if worst > 0 else 1.0)
    assert 0 < margin.margin <= 1


def test_worker_processes_find_the_same_margin(references: list[Trace]) -> None:
    here = _margin(references, None, workers=1)
    assert _margin(references, None, workers=3) == here


def test_fewer_than_three_references_give_no_margin(references: list[Trace]) -> None:
    margin = _margin(references[:2], 0.0)
    assert (margin.margin, margin.slowdowns_pct) == (1.0, ())


@pytest.mark.parametrize("latency_s", [0.0, None])
def test_an_exact_prediction_stays_within_its_budget(references: list[Trace], latency_s: float | None) -> None:
    reference = references[1]
    slowdown = held_out_slowdown_pct(reference, reference, load_profile("h200"), BUDGET, latency_s)
    assert within_budget(slowdown, BUDGET)
