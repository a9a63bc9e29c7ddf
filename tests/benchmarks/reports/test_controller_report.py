"""Where the controller benchmark looks for its overhead: the per-window step times it records
(``benchmarks/h200/controller.py``), the figures the report makes of them (``benchmarks/reports/controller.py``) and
their Markdown (``benchmarks/reports/controller_markdown.py``)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

import benchmarks.reports.controller
import benchmarks.reports.controller_markdown
import benchmarks.reports.controller_timing


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return benchmarks.reports.controller


def _window(on: bool, step_s: list[float]) -> dict[str, Any]:
    return {"controller": on, "steps": len(step_s), "elapsed_s": sum(step_s), "step_s": step_s,
            "summary": {"controlled_steps": 5} if on else None}


def test_step_figures_tell_a_slow_window_from_one_long_step(report: ModuleType) -> None:
    windows = [_window(True, [0.1] * 9 + [0.3]), _window(False, [0.1] * 10), _window(False, [0.1] * 10),
               _window(True, [0.11] * 10)]
    figures = report.step_figures(windows)
    assert figures["median_step_pairs"] == pytest.approx([0.0, 0.1])  # the long step moves no median
    assert figures["with"]["long_step_share"] == pytest.approx((0.3 / 1.2 + 0.0) / 2)
    assert figures["without"]["long_step_share"] == 0.0
    assert [p["overhead"] for p in figures["pairs"]] == pytest.approx([0.2, 0.1])
    assert [p["controlled_steps"] for p in figures["pairs"]] == [5, 5]


def test_windows_without_step_times_have_no_step_figures(report: ModuleType) -> None:
    windows = [{**_window(True, [0.1]), "step_s": []}, _window(False, [0.1])]
    assert report.step_figures(windows) is None


def test_lead_ins_add_up_over_the_windows_and_are_none_before_the_code_that_counts_them(report: ModuleType) -> None:
    def window(waits: int, late_ms: list[float], missed: int) -> dict[str, Any]:
        quantiles = {"median": late_ms[0], "p99": late_ms[-1]} if late_ms else {"median": None, "p99": None}
        return {"summary": {"lead_in": {"waits": waits, "late": len(late_ms), "missed": missed,
                                        "late_ms": quantiles}}}

    windows = [window(10, [0.5, 2.0], 0), window(8, [], 1), window(12, [1.5, 4.0], 0), {"summary": None}]
    assert report.lead_in_figures({"windows": windows}) == {
        "waits": 30, "late": 4, "missed": 1, "late_ms_median_of_windows": 1.0, "late_ms_p99_max": 4.0}
    assert report.lead_in_figures({"windows": [{"summary": {"controlled_steps": 5}}]}) is None


@pytest.mark.parametrize(("due_us", "error_ms"), [(1000.0, -1.0), (2000.0, 0.0), (2500.0, 0.0), (5000.0, 0.0),
                                                  (6500.0, 1.5)])
def test_a_steps_first_change_is_on_time_anywhere_in_the_gpus_idle_gap(due_us: float, error_ms: float) -> None:
    timing = benchmarks.reports.controller_timing
    assert timing.gap_error_ms(due_us, previous_end_us=2000.0, start_us=5000.0) == pytest.approx(error_ms)


def test_the_markdown_names_each_workloads_overhead_and_its_verdict(report: ModuleType) -> None:
    windows = [_window(True, [0.101] * 10), _window(False, [0.1] * 10), _window(False, [0.1] * 10),
               _window(True, [0.1005] * 10)]
    result = {"command": "python -m benchmarks.h200.controller run DIR", "targets": report.TARGETS,
              "run": {"machine": "vm", "python": "3.12", "started_utc": "t0", "nvidia_smi_before": "-"},
              "overhead": {"w": report.overhead_figures(windows)}, "timing": {}, "decisions": {}}
    text = benchmarks.reports.controller_markdown.markdown(result)
    assert "| w | 100.00 | 100.75 | +0.75% |" in text
    assert "end-to-end: not run" in text and "## Where the overhead shows" in text
