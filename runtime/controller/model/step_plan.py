"""A schedule on the step's expected timeline: when each clock change is due and when to request it.

The timeline is the captured step's own (kernel durations and idle gaps as measured, gaps scaled to the
unprofiled step time, :func:`kdvfs.envs.trace.trace.with_measured_gaps`); at locked clocks each kernel's time is
scaled by the cost model's ratio to its auto time. In a dry run the GPU stays in auto mode, so the timeline is
the auto one. The change instants follow :func:`kdvfs.envs.model.schedule.request_times` (aimed at the start of
the idle gap before the kernel that needs the new clocks, a switching latency apart at least). At run time the
whole timeline is stretched by ``scale`` (measured over expected step time; the controller then places each
change at the step's pace between its anchors once learned: :mod:`kdvfs.runtime.controller.timing.pace`) and requests
go out one latency before each change is due; a request due earlier than one latency after the step's start is
issued during the previous step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from kdvfs.agents.common.problem import Problem
from kdvfs.common.arrays import Array
from kdvfs.envs.model.schedule import Schedule, execute, request_times
from kdvfs.envs.trace.trace import with_measured_gaps


@dataclass(frozen=True)
class Request:
    """One clock request within an issuing window (a step, from its start on the GPU).

    ``offset_s``: when to issue it; ``due_s``: when the change must be in effect; ``next_step``: the change
    belongs to the step after the window's; ``kernel``: the kernel that needs it; ``clocks``: the action label.
    """

    offset_s: float
    due_s: float
    next_step: bool
    kernel: int
    clocks: str


@dataclass(frozen=True)
class StepPlan:
    """The step's clock changes on its expected timeline.

    Attributes:
        kernels: (C,) the kernel of each change; the first is kernel 0, the step's starting clocks.
        due_s: (C,) when each change is due, from the step's start (s).
        clocks: action labels of the changes (``"1410:3201"``, ``"auto:3201"``).
        expected_s: expected step time with the schedule applied (dry run: in auto mode) (s).
        auto_s: expected step time in auto mode (s).
        kernel_start_s: (K,) expected start of each kernel from the step's start (s).
    """

    kernels: Array
    due_s: Array
    clocks: tuple[str, ...]
    expected_s: float
    auto_s: float
    kernel_start_s: Array = field(repr=False)

    @classmethod
    def build(cls, problem: Problem, schedule: Schedule, dry_run: bool) -> StepPlan:
        costs = problem.costs
        measured = with_measured_gaps(problem.trace)
        measured_s = np.asarray(measured.duration_s + measured.gap_before_s)
        ratio = costs.time_s / costs.time_s[:, [costs.auto_index]]
        timeline = replace(costs, time_s=np.ones_like(ratio) * measured_s[:, None] if dry_run
                           else ratio * measured_s[:, None])
        actions = np.asarray(schedule.actions, dtype=np.int64)
        changes, effective = request_times(timeline, actions, problem.latency_s)
        if dry_run:
            ran, expected_s = np.full_like(actions, costs.auto_index), float(measured_s.sum())
        else:
            outcome = execute(timeline, actions, problem.latency_s, problem.stall_s)
            ran, expected_s = outcome.applied, outcome.time_s
        durations = timeline.time_s[np.arange(costs.kernels), ran]
        starts = np.cumsum(durations) - durations + np.asarray(measured.gap_before_s)
        kernels = np.concatenate([[0], changes]).astype(np.int64)
        return cls(kernels, np.concatenate([[0.0], effective]), tuple(costs.label(int(actions[k])) for k in kernels),
                   expected_s, float(measured_s.sum()), starts)

    def requests(self, scale: float, latency_s: float, first: bool = False) -> list[Request]:
        """The requests of one issuing window, in issue order, with the timeline stretched by ``scale``.

        A window issues its step's changes due at least one latency after its start and the next step's
        earlier ones; the ``first`` window (nothing requested for this step yet) also issues those of its
        own step at once, late.
        """
        step_s = scale * self.expected_s
        out = []
        for kernel, due, clocks in zip(self.kernels, self.due_s, self.clocks, strict=True):
            due_s = scale * float(due)
            offset_s = due_s - latency_s
            if offset_s >= 0:
                out.append(Request(offset_s, due_s, False, int(kernel), clocks))
                continue
            out.append(Request(offset_s + step_s, due_s + step_s, True, int(kernel), clocks))
            if first:
                out.append(Request(0.0, due_s, False, int(kernel), clocks))
        return sorted(out, key=lambda r: (r.offset_s, r.next_step))
