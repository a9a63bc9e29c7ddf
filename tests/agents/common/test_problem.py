"""The one over-budget predicate every report uses (plan notes, compare marks, within-budget rates)."""

from __future__ import annotations

from kdvfs.agents.common.problem import BUDGET_TOLERANCE_PCT, within_budget


def test_within_budget_counts_rounding_as_within_and_anything_more_as_over() -> None:
    assert within_budget(1.0, 0.01) and within_budget(1.0 + BUDGET_TOLERANCE_PCT / 2, 0.01)
    assert not within_budget(1.0 + 2 * BUDGET_TOLERANCE_PCT, 0.01)
    assert within_budget(-0.5, 0.0) and not within_budget(0.01, 0.0)
