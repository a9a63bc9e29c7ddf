"""Figure ranges over the profile's parameter ranges contain the nominal figures and answer the latency flag."""

from __future__ import annotations

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.evaluation.compare import compare
from kdvfs.agents.evaluation.uncertainty import compare_ranges, range_of
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.uncertainty import UncertaintySpec
from kdvfs.envs.trace.bundled import open_trace

METHODS = ("static", "per-phase")


def test_ranges_contain_the_nominal_rows() -> None:
    trace, profile = open_trace("h200/gpt3xl-1layer-b4"), load_profile("h200")
    problem = Problem.build(trace, profile, 0.01)
    rows = compare(problem, [0.01, 0.05], METHODS)
    calls: list[tuple[int, int]] = []
    ranges = compare_ranges(trace, profile, rows, [0.01, 0.05], None, UncertaintySpec(samples=3),
                            METHODS, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 3), (2, 3), (3, 3)]
    for row in rows:
        spread = range_of(ranges, row)
        assert spread is not None and spread.samples <= 3
        low, high = spread.energy_saved_pct
        assert low <= row.executed.energy_saved_pct <= high
        low, high = spread.slowdown_pct
        assert low <= row.executed.slowdown_pct <= high
        assert spread.as_json()["method"] == "latin-hypercube"
    assert any(r.energy_saved_pct[0] < r.energy_saved_pct[1] for r in ranges.values())
