"""A complete run summary for tests of what reads one (the job summary, ``kdvfs run``'s table), its fields
overridden by keyword."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

from kdvfs.runtime.controller.model.run_summary import (
    AnchorFigures,
    ControllerCpu,
    HostCost,
    JobSummary,
    LeadIn,
    Measured,
    NetEffect,
    Predicted,
    Quantiles,
    RankRow,
    RequestFigures,
    RunSummary,
)
from tests.schema_check import strict_loads, validate

NONE = Quantiles(None, None)
MEASURED = Measured(None, None, None, None, 3, 3)
RANGE = {"energy_saved_pct": [1.0, 3.0], "slowdown_pct": [0.2, 0.9], "coverage": 0.9, "parameter_samples": 0,
         "seed": 0, "basis": {"profile": "h200", "own_data": True, "level": {"key": "h200", "source": "s",
                                                                              "measurements": 1},
                              "clocks": {"key": "h200", "source": "s", "measurements": 1}, "note": None}}


def run_summary(**fields: Any) -> RunSummary:
    """One rank's summary of a 100-step run on a fake GPU, with ``fields`` replaced."""
    summary = RunSummary(
        rank=0, world_size=1, gpu_index=0, source="plan plan.json (latency-optimal)", gpu="h200", trace="gpt2s",
        dry_run=False, clock_control="nvml", steps=100, controlled_steps=60, switches=4, mismatches=0,
        backed_off=False, backoff_reason="", guard_backoffs=0, guard_slowdown_pct=None, guard_off=None,
        not_measured_on_a_gpu=None, error=None, observe_only=None, restore_error=None,
        anchors=AnchorFigures(0, 0, 0, 0, 0, "time", None), online_decisions=None, online=None, shapes=None,
        auto_reasons={}, lead_in=LeadIn(0, 0, 0, NONE), controller_cpu=ControllerCpu(0.01, 0.001, 0.001, None),
        host_cost=HostCost(0.01, None, None, 0.01, 1e-4, 1e-4, 0.001, 0.001, 100, 1.0),
        requests=RequestFigures(0, 0, None, NONE), window_steps=100, windows=6, step_time_s=0.1,
        energy_j_per_step=95.0, energy_j_per_step_auto=95.0, energy_j_per_step_controlled=95.0, measured=MEASURED,
        measured_net=NetEffect(None, None, None, None, 0.5), ab_share=0.25, energy_measured=True, energy_reads=10,
        energy_counter=None, predicted=Predicted(2.0, 0.5, 2, 0.1, RANGE), gpu_restored=True)
    return replace(summary, **fields)


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
    return bool(a == b)


def checked(summary: RunSummary | None) -> RunSummary:
    """``summary`` (a controller's), once ``kdvfs run``'s JSON of it met the schema and read back the same."""
    assert summary is not None
    document = strict_loads(json.dumps(JobSummary(summary, [RankRow.of(summary)]).to_json()))
    validate(document, "run-summary")
    assert _close(RunSummary.from_json(summary.to_json()).to_json(), summary.to_json())
    return summary
