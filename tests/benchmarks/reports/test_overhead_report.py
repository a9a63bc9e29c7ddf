"""``benchmarks/reports/overhead.py``: kdvfs's whole cost from the processes of ``benchmarks/h200/overhead.py run``."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

import benchmarks.reports.overhead


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return benchmarks.reports.overhead


def _summary(share_pct: float) -> dict[str, Any]:
    cost = {"thread_ms": 100.0, "energy_thread_ms": 20.0, "hooks_ms": 10.0, "total_ms": 130.0, "per_step_ms": 0.65,
            "thread_per_step_ms": 0.5, "step_share_pct": share_pct, "thread_step_share_pct": share_pct / 2,
            "wakes": 2000, "wakes_per_step": 10.0}
    return {"steps": 200, "controlled_steps": 150, "host_cost": cost, "measured": {},
            "online": {"decision_us": {"median": 30.0, "p99": 90.0}, "wakes": {"policy": 1200, "proposal": 300}},
            "requests": {"planned": 40, "late": 2, "late_ms": {"median": 0.1, "p99": 0.3}},
            "energy_counter": {"reads": 50, "calibration_reads": 30, "relock_reads": 4, "update_period_ms": 100.0,
                               "read_ms": 4.0, "calibration_cpu_s": 0.12}}


def _process(report: ModuleType, pair: int, with_kdvfs: bool, step_s: float, exit_code: int = 0) -> dict[str, Any]:
    steps = report.WARMUP_STEPS + 100
    return {"label": "w", "pair": pair, "with": with_kdvfs, "exit_code": exit_code, "step_s": [step_s] * steps,
            "cpu_s": [0.01 * i for i in range(steps + 1)], "summary": _summary(1.0) if with_kdvfs else None,
            "pairs_slowdown_pct": [0.1, -0.1, 0.05, -0.05] if with_kdvfs else [],
            "windows": [{"arm": arm, "pair": 0, "steps": 10, "controlled_steps": 10 if arm == "B" else 0,
                         "host_pace_s": pace_s} for arm, pace_s in (("A", 0.001), ("B", 0.00101))]
            if with_kdvfs else []}


def test_the_overhead_is_per_abba_pair_and_a_failed_process_leaves_its_pair_out(report: ModuleType) -> None:
    processes = [_process(report, 0, False, 0.100), _process(report, 0, True, 0.1002),
                 _process(report, 1, True, 0.1003), _process(report, 1, False, 0.100),
                 _process(report, 2, False, 0.100), _process(report, 2, True, 0.2, exit_code=1)]
    figures = report.workload_figures(processes)
    assert figures["overhead_pct"]["pairs"] == pytest.approx([0.2, 0.3])
    assert figures["failed_processes"] == 1 and figures["dry_run_slowdown_pct"]["n"] == 8
    assert figures["host_cost_parts_ms_per_step"]["energy_thread_ms"] == pytest.approx(40.0 / 400)
    assert figures["energy_learning_ms_per_step"] == pytest.approx(2 * 120.0 / 400)
    assert figures["wakes_per_step"] == {"policy": 6.0, "proposal": 1.5}
    verdicts = report.verdicts(figures)
    assert verdicts == {"slowdown_points": True, "overhead_pct": True, "host_cpu_pct": True, "decision_us": True,
                        "late_ms": True}
    page = report.markdown({"run": {"command": "c", "machine": "m", "started_utc": "t", "nvidia_smi_before": "-"},
                            "workloads": {"w": figures}, "verdicts": {"w": verdicts}})
    assert "| w |" in page
    assert figures["host_pace_arm_pct"]["n"] == 2 and "- w: +1.00% [+1.00, +1.00] (n=2)" in page


def test_a_power_field_that_is_the_counters_last_period_mean_matches_it_at_lag_0(report: ModuleType) -> None:
    """A counter updating every 100 ms with the energy of its last period, read every 4 ms; a power field that
    gives that period's mean power, one that gives nothing."""
    powers_w = [300.0 + 200.0 * ((k // 3) % 2) + 7.0 * (k % 5) for k in range(40)]
    energies_j = [sum(powers_w[:k]) * 0.1 for k in range(len(powers_w) + 1)]
    rows = []
    for i in range(900):
        start_s = 0.004 * i + 0.0013
        k = int(start_s / 0.1)  # the updates done by then
        rows.append([start_s, start_s + 0.003, energies_j[k], powers_w[k - 1] if k else 0.0, None])
    compared = report.power_vs_energy({"fields": ["usage", "instant"], "rows": rows})
    assert compared["usage"]["0"]["median_abs_diff_pct"] == pytest.approx(0.0, abs=1e-9)
    assert compared["usage"]["0"]["correlation"] == pytest.approx(1.0)
    assert compared["usage"]["1"]["median_abs_diff_pct"] > 1.0
    assert compared["instant"]["0"] == {"median_abs_diff_pct": None, "correlation": None, "periods": 0}
    assert compared["usage"]["0"]["periods"] >= 30


def test_the_field_value_energy_read_is_reported_where_probed(report: ModuleType) -> None:
    """The probe's read of the counter through the field-value call: its cost where the driver gives it, a note
    where it does not, nothing for a run that predates it."""
    read = {"reads": 200, "given": 200, "read_wall_ms": 0.012, "read_cpu_ms": 0.011, "update_period_ms": 100.0}
    given = report.markdown({"run": {"command": "c", "machine": "m", "started_utc": "t", "nvidia_smi_before": "-",
                                     "probe": {"energy": read, "power": read, "energy_field": read,
                                               "gil": {"ratio": 1.0}}},
                             "workloads": {}, "verdicts": {}})
    assert "field-value call: 0.0120 ms wall, 0.0110 ms CPU (median of 200); updated every 100.0 ms" in given
    refused = report.markdown({"run": {"command": "c", "machine": "m", "started_utc": "t", "nvidia_smi_before": "-",
                                       "probe": {"energy": read, "power": read, "gil": {"ratio": 1.0},
                                                 "energy_field": {**read, "given": 0}}},
                               "workloads": {}, "verdicts": {}})
    assert "field-value call: not given by this driver" in refused
    older = report.markdown({"run": {"command": "c", "machine": "m", "started_utc": "t", "nvidia_smi_before": "-",
                                     "probe": {"energy": read, "power": read, "gil": {"ratio": 1.0}}},
                             "workloads": {}, "verdicts": {}})
    assert "field-value call" not in older


def test_the_own_process_arm_is_its_own_workload_against_the_same_pairs_without_kdvfs(report: ModuleType) -> None:
    """``run --own-process``: a third process per pair; the report gives the arm as ``LABEL (own process)``, its
    overhead against the same pairs' processes without kdvfs, and what the training process pays."""
    own = [_process(report, 0, True, 0.1001), _process(report, 1, True, 0.1001)]
    for process in own:
        process["own_process"] = True
        process["summary"]["host_cost"].update(server_ms=20.0, training_step_share_pct=0.3)
    processes = [_process(report, 0, False, 0.100), _process(report, 0, True, 0.1002), own[0],
                 own[1], _process(report, 1, True, 0.1003), _process(report, 1, False, 0.100)]
    by_arm = report.arms("w", processes)
    assert list(by_arm) == ["w", "w (own process)"]
    figures = {name: report.workload_figures(arm) for name, arm in by_arm.items()}
    assert figures["w"]["overhead_pct"]["pairs"] == pytest.approx([0.2, 0.3])
    assert figures["w (own process)"]["overhead_pct"]["pairs"] == pytest.approx([0.1, 0.1])
    assert figures["w (own process)"]["host_cost_parts_ms_per_step"]["server_ms"] == pytest.approx(0.1)
    assert figures["w (own process)"]["host_cost"]["training_step_share_pct"] == pytest.approx(0.3)
    page = report.markdown({"run": {"command": "c", "machine": "m", "started_utc": "t", "nvidia_smi_before": "-",
                                    "own_process": True}, "workloads": figures, "verdicts": {}})
    assert "a third process in each pair" in page
    assert "| w | " in page and " / 0.05 / 0.00; -% |" in page  # the in-process arm: no poller CPU in these records
    assert "| w (own process) | " in page and " / 0.05 / 0.10; 0.30% |" in page
    assert list(report.arms("w", processes[:2])) == ["w"]  # a run without the arm
    difference = report.own_process_difference(figures)
    assert list(difference) == ["w"] and difference["w"]["pairs"] == pytest.approx([0.1, 0.2])
    assert difference["w"]["n"] == 2 and difference["w"]["ci95"] is not None
    page = report.markdown({"run": {"command": "c", "machine": "m", "started_utc": "t", "nvidia_smi_before": "-",
                                    "own_process": True}, "workloads": figures, "verdicts": {},
                            "own_process_difference": difference})
    assert "in-process overhead minus own-process overhead +0.15 [" in page and "pairs +0.10, +0.20" in page


def test_the_arms_are_compared_on_the_pairs_both_ran(report: ModuleType) -> None:
    """A pair whose own-process arm failed drops out of the difference, not out of alignment."""
    own = [_process(report, 0, True, 0.1001, exit_code=1), _process(report, 1, True, 0.1001)]
    for process in own:
        process["own_process"] = True
    processes = [_process(report, 0, False, 0.100), _process(report, 0, True, 0.1002), *own,
                 _process(report, 1, True, 0.1003), _process(report, 1, False, 0.100)]
    figures = {name: report.workload_figures(arm) for name, arm in report.arms("w", processes).items()}
    assert report.own_process_difference(figures)["w"]["pairs"] == pytest.approx([0.2])


def test_the_timelines_looks_are_reported_where_every_summary_counts_them(report: ModuleType) -> None:
    """``host_cost.timeline_wakes`` (the GPU timeline's looks, of the thread's wakes) per step beside the decision
    points; absent from a summary written before it (or null: a timeline that makes none), not reported."""
    processes = [_process(report, 0, False, 0.100), _process(report, 0, True, 0.1002)]
    assert report.workload_figures(processes)["timeline_wakes_per_step"] is None
    processes[1]["summary"]["host_cost"]["timeline_wakes"] = 300
    figures = report.workload_figures(processes)
    assert figures["timeline_wakes_per_step"] == pytest.approx(300 / _summarised_steps(processes))
    page = report.markdown({"run": {"command": "c", "machine": "m", "started_utc": "t", "nvidia_smi_before": "-"},
                            "workloads": {"w": figures}, "verdicts": {}})
    assert "; timeline 1.5)" in page


def _summarised_steps(processes: list[dict[str, Any]]) -> int:
    """The steps the report counts: those of the summaries of the processes with kdvfs."""
    return sum(p["summary"]["steps"] for p in processes if p["with"])


def test_the_host_pace_arm_pairs_each_a_window_with_its_b_window_run_as_intended(report: ModuleType) -> None:
    def window(arm: str, pair: int | None, pace_s: float | None, controlled: int | None = None) -> dict[str, Any]:
        steps = 10
        return {"arm": arm, "pair": pair, "steps": steps, "host_pace_s": pace_s,
                "controlled_steps": (steps if arm == "B" else 0) if controlled is None else controlled}

    first = {"windows": [window("B", 0, 0.00102), window("A", 0, 0.001), window("B", None, 0.005),
                         window("A", 1, 0.001), window("B", 1, 0.00104)]}
    backed_off = {"windows": [window("B", 0, 0.002, controlled=0), window("A", 0, 0.001),  # B at auto: left out
                              window("A", 1, 0.002), window("B", 1, 0.00206), window("A", 2, None),
                              window("B", 2, 0.001)]}
    pace = report.host_pace_arm([first, backed_off, {"pairs_slowdown_pct": []}])
    assert pace["n"] == 3 and pace["mean"] == pytest.approx(3.0)
    assert report.host_pace_arm([{"windows": []}])["n"] == 0


def test_the_page_names_the_policy_a_run_was_given(report: ModuleType) -> None:
    """The results page says which policy the controller ran (``run`` records it: ``--policy FILE``, else the
    shipped one); a record from before the key says nothing."""
    figures = {"w": report.workload_figures([_process(report, 0, False, 0.100), _process(report, 0, True, 0.1002)])}
    run = {"command": "c", "machine": "m", "started_utc": "t", "nvidia_smi_before": "-"}
    given = report.markdown({"run": {**run, "policy": "benchmarks/data/learned/h200-s0.kdvfs-policy.npz"},
                             "workloads": figures, "verdicts": {}})
    assert "- policy: `benchmarks/data/learned/h200-s0.kdvfs-policy.npz`" in given
    assert "- policy:" not in report.markdown({"run": run, "workloads": figures, "verdicts": {}})
