"""A residual policy (``KernelDVFSResidual-v0``) deciding online inside each controlled step, on the fake GPU
(virtual clock): the controller runs it through the interface it runs every online policy through."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kdvfs.agents.learned.policy.frozen import FrozenPolicy
from kdvfs.envs.env.observing.measured import RELEASE
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.drift import DriftModel
from tests.agents.learned.test_residual_online import RESIDUAL_POLICY, releasing_past
from tests.runtime.controller_helpers import fake_controller, log_records, run_steps
from tests.runtime.summaries import checked

ANCHOR_KERNELS = tuple(range(8, 112, 8))  # the small step has 115 kernels


def _run(tmp_path: Path, steps: int = 40, policy: Path = RESIDUAL_POLICY, **options: object) -> tuple[Any, Any, Path]:
    log = tmp_path / "run.jsonl"
    controller, gpu, timeline = fake_controller(policy, drift=DriftModel(seed=1), log=str(log), **options)
    timeline.anchor_kernels = ANCHOR_KERNELS
    with controller:
        run_steps(controller, steps)
    return controller, gpu, log


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_residual_policy_decides_online_in_each_controlled_step(tmp_path: Path, dry_run: bool) -> None:
    controller, gpu, log = _run(tmp_path, dry_run=dry_run)
    summary = checked(controller.summary)
    assert summary.source == "residual policy h200-residual.kdvfs-policy.npz (online)"
    assert summary.controlled_steps > 20 and summary.online_decisions > 20 and summary.online.progress["anchor"] > 0
    decisions = log_records(log, "decision")
    assert len(decisions) == summary.online_decisions and {len(d["action"]) for d in decisions} == {3}
    assert {d["source"] for d in decisions} == {"anchor", "expected"}
    for step in {d["step"] for d in decisions}:
        kernels = [d["kernel"] for d in decisions if d["step"] == step]
        assert kernels == sorted(kernels)  # the position never goes back within a step
    online_requests = [r for r in log_records(log, "request") if r.get("online") and r["kernel"] > 0]
    assert len(online_requests) > 20 and all(r["due_s"] >= r["request_s"] for r in online_requests)
    if dry_run:
        assert gpu.set_calls == [] and summary.online.took_effect.get("observed", 0) == 0
    else:
        assert summary.online.took_effect.get("observed", 0) > 0 and summary.switches > 0
        assert gpu.set_calls[-1].name == "reset_clocks" and summary.gpu_restored


def test_a_release_returns_the_clocks_to_auto_once_and_the_step_goes_quiet(tmp_path: Path) -> None:
    """A policy that follows the fitting plan and releases at its first decision past half the step: in every
    controlled step the controller requests auto once (after the change pending then, if one was: it is in
    flight, as in the environment), then nothing until the next step's first pair."""
    policy = tmp_path / RESIDUAL_POLICY.name
    releasing_past(FrozenPolicy.load(RESIDUAL_POLICY, load_profile("h200")), 0.5).save(policy)
    controller, _, log = _run(tmp_path, steps=30, policy=policy)
    summary = checked(controller.summary)
    records = [r for r in map(json.loads, log.read_text().splitlines()) if r["event"] in ("decision", "request")]
    releases = [i for i, r in enumerate(records) if r["event"] == "decision" and r["action"][2] == RELEASE]
    assert summary.controlled_steps > 10 and len(releases) >= summary.controlled_steps - 2
    for i in releases:
        step = records[i]["step"]
        after = [r for r in records[i + 1:] if r["step"] == step]  # in the log's order
        assert all(r["event"] == "request" for r in after)  # no decision after a release
        clocks = [r["clocks"] for r in after if r.get("online") and r["kernel"] > 0]
        if clocks and clocks[0] == records[i]["pending"]:
            clocks = clocks[1:]  # the change pending, held until its instant: it lands first
        at_auto = records[i]["in_effect"] == "auto:3201" and records[i]["pending"] in (None, "auto:3201")
        assert clocks == ([] if at_auto else ["auto:3201"])  # auto once (none if it was in effect)
    assert sum(records[i]["in_effect"] != "auto:3201" for i in releases) > len(releases) // 2
