"""The run's summary (:class:`~kdvfs.runtime.controller.model.run_summary.RunSummary`), built once the
controller's thread stopped: steps, switches, what the guard did, the accounting's estimates, the anchors',
source's and shapes' figures, the thread's CPU cost, the plan's predicted saving and slowdown.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from kdvfs.agents.common.problem import score
from kdvfs.agents.evaluation.ranges import predicted_range
from kdvfs.runtime.controller.control.assembly import ThreadParts
from kdvfs.runtime.controller.control.opening import Opened, clock_control_of, connection_error
from kdvfs.runtime.controller.control.remote_timeline import RemoteTimeline
from kdvfs.runtime.controller.measurement.accounting import Accounting
from kdvfs.runtime.controller.measurement.host_cost import host_cost
from kdvfs.runtime.controller.model.plan import Plan
from kdvfs.runtime.controller.model.run_summary import (
    ControllerCpu,
    OnlineFigures,
    Predicted,
    RunSummary,
    ShapeFigures,
)
from kdvfs.runtime.controller.timing.gpu_timeline import BoardTimeline
from kdvfs.runtime.device.errors import observe_only_reason
from kdvfs.runtime.job import Rank


def run_summary(opened: Opened, parts: ThreadParts, rank: Rank, gpu_restored: bool) -> RunSummary:
    """The summary of the run of ``opened`` by ``parts`` on ``rank``, whose GPU is back at its own control when
    ``gpu_restored``."""
    issuer, actuator, plan, config = parts.issuer, parts.actuator, opened.plan, opened.config
    guard = issuer.guard.slowdown()
    online = parts.source.figures()
    shapes = None if parts.shapes is None else parts.shapes.figures()
    counted = parts.timeline if isinstance(parts.timeline, BoardTimeline) else None  # its hooks' time, sleeps
    hooks_s = None if counted is None else counted.hook_s
    timeline_wakes = None if counted is None else counted.sleeps
    server_s = None if counted is None else counted.server_cpu_s
    return RunSummary(
        rank=rank.rank, world_size=rank.world_size, gpu_index=opened.device.index,
        source=source_that_ran(plan, online, shapes),
        gpu=plan.problem.profile.name, trace=plan.problem.trace.meta.workload, dry_run=config.dry_run,
        clock_control=clock_control_of(opened.device), steps=issuer.steps, controlled_steps=issuer.controlled_steps,
        switches=actuator.switches, mismatches=issuer.matcher.mismatches, backed_off=issuer.guard.backoffs > 0,
        backoff_reason=issuer.guard.reason, guard_backoffs=issuer.guard.backoffs,
        guard_slowdown_pct=None if guard is None else guard.mean_pct, guard_off=issuer.guard.off,
        not_measured_on_a_gpu=config.not_measured_on_a_gpu(opened.fake_nvml),
        error=str(issuer.error) if issuer.error is not None else connection_error(opened.device),
        observe_only=observe_only_reason(issuer.error),
        restore_error=None if actuator.restore_error is None else str(actuator.restore_error),
        anchors=issuer.anchors.figures(None if parts.hooks is None else parts.hooks.blocks),
        online_decisions=None if online is None else online.decisions, online=online,
        shapes=shapes,
        auto_reasons=dict(sorted(issuer.auto_reasons.items())), lead_in=issuer.lead_in_figures(),
        controller_cpu=ControllerCpu(issuer.cpu_s, issuer.end_wait_cpu_s, issuer.issue_cpu_s, hooks_s),
        host_cost=host_cost(issuer.cpu_s, parts.accounting.energy_thread_cpu_s, hooks_s, issuer.steps,
                            issuer.step_interval_s(), parts.thread_clock.sleeps + (timeline_wakes or 0), server_s,
                            timeline_wakes, isinstance(parts.timeline, RemoteTimeline)),
        requests=actuator.figures(),
        **parts.accounting.figures(issuer.controlled_steps / issuer.steps if issuer.steps else 0.0),
        predicted=Predicted(**{k: v for k, v in asdict(score(plan.problem, plan.schedule)).items() if k != "method"},
                            range=predicted_range(plan.problem, plan.schedule).as_json()),
        gpu_restored=gpu_restored)


def source_that_ran(plan: Plan, online: OnlineFigures | None, shapes: ShapeFigures | None) -> str:
    """What ran through the controlled steps: the plan's source; for a frozen policy in a run whose steps vary,
    in how many buckets it decided online and in how many its rollout was replayed (``policy NAME (online, 3
    buckets; replayed, 1 bucket)``; no controlled step: ``(online, 0 buckets)``, or ``replayed``)."""
    if shapes is None or plan.policy_name is None:
        return plan.source
    counts = (("online", 0 if online is None else len(online.steps_by_bucket)),
              ("replayed", len(shapes.replayed_steps_by_bucket)))
    ran = [(how, n) for how, n in counts if n] or [("online" if plan.online is not None else "replayed", 0)]
    buckets = "; ".join(f"{how}, {n} bucket" + "s" * (n != 1) for how, n in ran)
    return f"{plan.policy_kind} {plan.policy_name} ({buckets})"


def window_records(accounting: Accounting | None) -> list[dict[str, Any]]:
    """The run's A/B windows (:class:`~kdvfs.runtime.controller.measurement.accounting.Window` fields and
    ``as_intended``)."""
    if accounting is None:
        return []
    return [{**asdict(w), "as_intended": w.as_intended} for w in accounting.windows]
