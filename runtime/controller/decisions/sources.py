"""Step sources: what the controller's thread runs through each controlled step.

The issuer (:mod:`kdvfs.runtime.controller.control.issuer`) decides which steps are controlled; a
:class:`StepSource` decides what the GPU's clocks do inside them. Two implement it:

* :class:`ReplayedSchedule`: a fixed schedule (a plan, or a frozen policy's noise-free rollout with
  ``--replay``), whose requests are placed on the step's anchors and issued at their instants;
* :class:`~kdvfs.runtime.controller.decisions.online.OnlineSteps`: a frozen policy deciding inside each step
  on live measurements.

The controller picks one when it opens (:func:`kdvfs.runtime.controller.controller.Controller`); nothing
else asks which it is.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kdvfs.runtime.controller.decisions.actuator import Actuator
from kdvfs.runtime.controller.event_log import EventLog
from kdvfs.runtime.controller.measurement.estimator import Interval
from kdvfs.runtime.controller.model.run_summary import OnlineFigures
from kdvfs.runtime.controller.model.step_plan import StepPlan
from kdvfs.runtime.controller.timing.anchors import Anchors
from kdvfs.runtime.controller.timing.gpu_timeline import StepEnd, StepTimeline
from kdvfs.runtime.device.host_time import Clock


@dataclass(frozen=True)
class ThreadContext:
    """What the controller's thread works with: the GPU timeline it waits on, the host clock it sleeps on, the
    event log it writes and the actuator its requests go through."""

    timeline: StepTimeline
    clock: Clock
    log: EventLog
    actuator: Actuator


class StepSource(Protocol):
    """What the issuer runs through each controlled step (see the module docstring)."""

    @property
    def next_request_s(self) -> float:
        """Host time of the next request the source may make (infinite when none is coming)."""
        ...

    @property
    def sleeps_lead_in(self) -> bool:
        """Whether the issuer sleeps through each controlled step's lead-in before handing it over."""
        ...

    def run(self, step: int, start_s: float, scale: float, first: bool, stop: threading.Event,
            lead_in: Callable[[], None] | None) -> None:
        """Run through step ``step``, which started at host time ``start_s`` and runs ``scale`` times its
        expected time; ``first``: the first controlled step after others; ``lead_in``: called before the
        step's first decision (the issuer's sleep through the lead-in; None: none). Returns early once ``stop``
        is set."""
        ...

    def feedback(self, measured: Interval | None) -> None:
        """A new A/B pair: the run's measured slowdown (%) is now ``measured``."""
        ...

    def observe(self, end: StepEnd, matched: bool, controlled: bool) -> None:
        """Learn from a finished step, after the anchors have."""
        ...

    def figures(self) -> OnlineFigures | None:
        """For the summary: the online decisions' figures (None for a replayed schedule)."""
        ...


class ReplayedSchedule:
    """A fixed schedule replayed in every controlled step (see the module docstring).

    Each request of :meth:`StepPlan.requests` (the timeline stretched by ``scale``) is placed on the latest
    anchor that precedes its issue instant by the margin (:meth:`Anchors.place`; the step's start when there
    is none) and issued ``early_s`` before its placed instant; a request for the clocks already requested is
    skipped.

    Args:
        plan: the step's schedule on its expected timeline.
        anchors: where the requests are placed.
        context: the thread's timeline, clock, log and actuator.
        latency_s: switching latency (s): requests go out this long before their change.
        early_s: requests go out this much earlier still (s), for the thread's late wake-up.
    """

    sleeps_lead_in = False

    def __init__(self, plan: StepPlan, anchors: Anchors, context: ThreadContext, latency_s: float,
                 early_s: float) -> None:
        self.plan, self.anchors, self.context = plan, anchors, context
        self.latency_s, self.early_s = latency_s, early_s
        self.next_request_s = math.inf

    def run(self, step: int, start_s: float, scale: float, first: bool, stop: threading.Event,
            lead_in: Callable[[], None] | None = None) -> None:
        actuator, clock = self.context.actuator, self.context.clock
        self.anchors.begin(step, start_s, scale)
        for request in self.plan.requests(scale, self.latency_s, first):
            if request.clocks == actuator.current:
                continue  # a repeat: nothing to request, nothing to wait for
            placed = self.anchors.place(request)
            self.next_request_s = placed.request_s - self.early_s
            if not clock.sleep_until(self.next_request_s, stop):
                return
            self.next_request_s = math.inf
            actuator.request(request.clocks, step=step + request.next_step, kernel=request.kernel,
                             request_s=placed.request_s, due_s=placed.due_s, **placed.record())

    def feedback(self, measured: Interval | None) -> None:
        """A replayed schedule does not follow the measured slowdown (the guard does)."""

    def observe(self, end: StepEnd, matched: bool, controlled: bool) -> None:
        """A replayed schedule learns nothing beyond the anchors."""

    def figures(self) -> None:
        return None
