"""Where the controller benchmark looks for its overhead: the per-window step times, garbage-collection passes
and training-thread scheduling it records (``benchmarks/controller_h200.py``) and the figures the report makes
of them (``benchmarks/controller_report.py``)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.benchmarks.scripts import script_module


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return script_module("controller_report")


def _window(on: bool, step_s: list[float], voluntary: float = 0.0) -> dict[str, Any]:
    return {"controller": on, "steps": len(step_s), "elapsed_s": sum(step_s), "step_s": step_s,
            "gc": {"0": [2, 0.002], "1": [0, 0.0], "2": [0, 0.0]},
            "training_thread": {"on_cpu_s": 0.5 * sum(step_s), "waiting_s": 0.0, "voluntary": voluntary,
                                "involuntary": 0.0},
            "summary": {"controlled_steps": 5} if on else None}


def test_step_figures_tell_a_slow_window_from_one_long_step(report: ModuleType) -> None:
    windows = [_window(True, [0.1] * 9 + [0.3], voluntary=20), _window(False, [0.1] * 10, voluntary=10),
               _window(False, [0.1] * 10, voluntary=10), _window(True, [0.11] * 10, voluntary=30)]
    figures = report.step_figures(windows)
    assert figures["median_step_pairs"] == pytest.approx([0.0, 0.1])  # the long step moves no median
    assert figures["with"]["long_step_share"] == pytest.approx((0.3 / 1.2 + 0.0) / 2)
    assert figures["without"]["long_step_share"] == 0.0
    assert figures["with"]["gc_per_window"]["0"] == pytest.approx([2.0, 2.0])  # passes, ms
    assert figures["with"]["training_thread_per_step"]["voluntary"] == pytest.approx((2.0 + 3.0) / 2)
    assert [p["voluntary"] for p in figures["pairs"]] == [[1.0, 2.0], [1.0, 3.0]]
    assert [p["controlled_steps"] for p in figures["pairs"]] == [5, 5]


def test_windows_without_step_times_have_no_step_figures(report: ModuleType) -> None:
    windows = [{**_window(True, [0.1]), "step_s": []}, _window(False, [0.1])]
    assert report.step_figures(windows) is None


def test_where_the_training_thread_slept_is_a_share_of_each_arms_samples(report: ModuleType) -> None:
    windows = [{**_window(on, [0.1, 0.1]), "training_thread_samples": samples} for on, samples in
               [(True, {"running": 6, "futex": 4}), (False, {"running": 9, "ioctl": 1}),
                (False, {"running": 10}), (True, {"running": 8, "futex": 2})]]
    figures = report.step_figures(windows)
    assert figures["with"]["blocked_share"] == {"running": 0.7, "futex": 0.3}
    assert figures["without"]["blocked_share"] == {"running": 0.95, "ioctl": 0.05}


def test_each_sampled_threads_shares_are_of_its_own_samples(report: ModuleType) -> None:
    shares = report.sample_shares([{"running": 3, "futex [heap]": 1, "pt_autograd_0: running": 1,
                                    "pt_autograd_0: futex python3.12": 4}])
    assert shares == {"running": 0.75, "futex [heap]": 0.25, "pt_autograd_0: running": 0.2,
                      "pt_autograd_0: futex python3.12": 0.8}


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
    timing = script_module("controller_timing")
    assert timing.gap_error_ms(due_us, previous_end_us=2000.0, start_us=5000.0) == pytest.approx(error_ms)
