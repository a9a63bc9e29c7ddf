"""One summary for a torchrun job: per A/B pair the ranks' joules summed and the slowest rank's seconds,
per-rank rows, and the job's step reduction (:func:`kdvfs.runtime.job.job_step`) without a group."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kdvfs.runtime.controller.measurement.job_summary import job_summary
from kdvfs.runtime.controller.model.run_summary import NetEffect, Predicted, RunSummary
from kdvfs.runtime.job import JobStep, job_step, rank_path
from tests.runtime.summaries import RANGE, run_summary
from tests.schema_check import strict_loads, validate


def _window(pair: int, arm: str, step_time_s: float, joules: float | None) -> dict[str, Any]:
    return {"pair": pair, "arm": arm, "as_intended": True, "steps": 10, "controlled_steps": 10 if arm == "B" else 0,
            "step_time_s": step_time_s, "energy_j_per_step": joules}


def _summary(rank: int, energy_j: float) -> RunSummary:
    return run_summary(rank=rank, gpu_index=3 - rank, steps=100 + rank, mismatches=rank, step_time_s=0.1 + rank / 100,
                       energy_j_per_step=energy_j, energy_j_per_step_auto=energy_j,
                       energy_j_per_step_controlled=energy_j,
                       measured_net=NetEffect(None, None, None, None, 0.5 + rank / 10),
                       predicted=Predicted(2.0 + rank, 0.5 + rank, 2, 0.1,
                                           {**RANGE, "energy_saved_pct": [1.0 + rank, 3.0 + 2 * rank],
                                            "slowdown_pct": [0.2 + rank, 0.9 + 3 * rank]}))


def test_the_job_sums_energy_and_takes_the_slowest_time() -> None:
    # rank 0 saves 10 of 100 J, rank 1 nothing of 300 J: the job saves 10 of 400 J = 2.5%
    windows = [[_window(p, "A", 0.100, 100.0) for p in range(3)] + [_window(p, "B", 0.101, 90.0) for p in range(3)],
               [_window(p, "A", 0.100, 300.0) for p in range(3)] + [_window(p, "B", 0.102, 300.0) for p in range(3)]]
    windows[1][3]["step_time_s"] = 0.100  # noise in pair 0 on rank 1 gives the interval its width
    job = job_summary([_summary(0, 95.0), _summary(1, 300.0)], windows)
    summary = job.summary
    assert summary.measured.energy_saved_pct == pytest.approx(2.5)
    assert summary.measured.slowdown_pct == pytest.approx((1.0 + 2.0 + 2.0) / 3)
    assert summary.energy_j_per_step == 395.0 and summary.step_time_s == 0.11 and summary.switches == 8
    assert summary.steps == 100 and summary.mismatches == 1
    assert summary.measured_net.controlled_share == 0.5
    assert summary.predicted.slowdown_pct == 1.5 and summary.predicted.energy_saved_pct == 2.5
    spread = summary.predicted.range  # as the figures: the saving's ends averaged, the slowdown's the largest
    assert spread is not None and spread["energy_saved_pct"] == [1.5, 4.0] and spread["slowdown_pct"] == [1.2, 3.9]
    assert spread["coverage"] == 0.9
    assert [(r.rank, r.gpu_index) for r in job.ranks] == [(0, 3), (1, 2)]
    validate(strict_loads(json.dumps(job.to_json())), "run-summary")


def test_a_pair_counts_for_energy_only_when_every_rank_measured_it() -> None:
    windows = [[_window(0, "A", 0.1, 100.0), _window(0, "B", 0.1, 90.0)],
               [_window(0, "A", 0.1, None), _window(0, "B", 0.1, 90.0)]]
    summary = job_summary([_summary(0, 95.0), _summary(1, 95.0)], windows).summary
    assert summary.measured.energy_saved_pct is None and summary.energy_j_per_step == 190.0


def test_one_rank_is_its_own_summary_with_its_row() -> None:
    job = job_summary([_summary(0, 95.0)], [[]])
    assert job.summary.rank == 0 and job.ranks[0].gpu_index == 3


def test_outside_torchrun_a_step_is_its_own_job_step_and_files_are_named_per_rank() -> None:
    step = JobStep(0.1, True, 0.3, 2.0)
    assert job_step(None, step) is step
    assert rank_path("a/step.trace.json.gz", 1).name == "step.rank1.trace.json.gz"
    assert rank_path("run.jsonl", 0).name == "run.rank0.jsonl" and rank_path("tb", 2).name == "tb.rank2"


def _varying_window(index: int, arm: str, kernel_s: float, rank: int) -> dict[str, Any]:
    """A window whose steps' mean kernel time is ``kernel_s``: joules follow it (rank 1 at twice rank 0's power),
    seconds too; the controlled arm saves 5% of the joules and slows by 1%, plus a little noise."""
    noise = 1 + 0.001 * ((index * 7 + rank * 3) % 5 - 2)
    controlled = arm == "B"
    return {**_window(index // 2, arm, kernel_s * 1.2 * (1.01 if controlled else 1.0) * noise,
                      kernel_s * 700.0 * (1 + rank) * (0.95 if controlled else 1.0) * noise),
            "first_step": 10 * index, "last_step": 10 * index + 9, "kernel_steps": kernel_s, "new_inputs": 0.0,
            "start_s": float(index), "end_s": index + 1.0}


def test_a_job_whose_steps_vary_is_measured_by_the_adjusted_estimate() -> None:
    # the controlled windows get longer steps on average: the pairs' mean would read their length as a cost
    kernel_s = [0.10 + 0.02 * ((i // 2) % 4) + (0.02 if i % 2 else 0.0) for i in range(24)]
    windows = [[_varying_window(i, "A" if i % 2 == 0 else "B", k, rank) for i, k in enumerate(kernel_s)]
               for rank in range(2)]
    summary = job_summary([_summary(0, 95.0), _summary(1, 300.0)], windows).summary
    saved, slowdown = summary.measured.energy_saved_pct, summary.measured.slowdown_pct
    assert saved == pytest.approx(5.0, abs=0.3) and slowdown == pytest.approx(1.0, abs=0.3)
    bounds = summary.measured.energy_saved_ci95_pct
    assert bounds is not None and bounds[0] < 5.0 < bounds[1]
    for rank_windows in windows:  # one shape: the pairs' mean, which the shape mix biases here
        for window in rank_windows:
            window["kernel_steps"] = None
    biased = job_summary([_summary(0, 95.0), _summary(1, 300.0)], windows).summary.measured.energy_saved_pct
    assert biased is not None and biased < 0
