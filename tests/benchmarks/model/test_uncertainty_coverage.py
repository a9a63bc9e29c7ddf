"""The coverage benchmark's counting (``benchmarks/model/uncertainty_coverage.py``) on data of known distribution."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

import benchmarks.model.uncertainty_coverage


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return benchmarks.model.uncertainty_coverage


def test_coverage_counts_hits_with_an_exact_interval(bench: ModuleType) -> None:
    result = bench.coverage([True] * 22 + [False] * 2)
    assert (result["covered"], result["n"]) == (22, 24) and result["share"] == pytest.approx(22 / 24)
    low, high = result["interval_95"]
    assert low == pytest.approx(0.730, abs=1e-3) and high == pytest.approx(0.990, abs=1e-3)
    assert bench.coverage([True] * 5)["interval_95"][1] == 1.0


def test_held_out_coverage_of_a_known_distribution_is_near_90_percent(bench: ModuleType) -> None:
    values = np.random.default_rng(11).normal(0.0, 0.05, 400)
    hits = bench.held_out_hits(values, [str(i) for i in range(400)])
    assert np.mean(hits) == pytest.approx(0.9, abs=0.03)


def test_held_out_coverage_sees_a_group_the_others_do_not_describe(bench: ModuleType) -> None:
    """Leave-one-group-out: a group shifted away from the rest is mostly outside the others' range."""
    rng = np.random.default_rng(5)
    values = np.concatenate([rng.normal(0.0, 0.01, 60), rng.normal(0.2, 0.01, 20)])
    groups = ["a"] * 30 + ["b"] * 30 + ["shifted"] * 20
    hits = np.array(bench.held_out_hits(values, groups))
    assert hits[:60].mean() > 0.85 and hits[60:].mean() < 0.1
