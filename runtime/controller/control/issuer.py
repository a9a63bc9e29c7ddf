"""The controller's background thread: follows the GPU step by step and runs the step source in controlled steps.

Owns, per step end marked by the training thread: waiting until the GPU finished the step (sleeping towards
its expected end), judging it (matcher, accounting, guard; under torchrun reduced over the ranks first,
:func:`kdvfs.runtime.job.job_step`), and deciding the next step: controlled (matching, a B window, the guard
not backed off: the source runs through it at ``scale``, the median measured over expected step time of the
last ``SCALE_STEPS`` matching steps) or at auto, counted by reason. Times are host seconds
(the controller's clock). ``next_request_s``: the host time of the request it sleeps towards (inf: none).

Invariants: a stopped thread requests nothing more; every step and request goes to the event log. Failure
modes: an error on the thread (NVML, say) returns the GPU to auto, ends control for the run and is reported in
the summary; training continues. The lead-in sleep and more: docs/design/controller.md.
"""

from __future__ import annotations

import math
import queue
import statistics
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from kdvfs.common.arrays import Array
from kdvfs.runtime.controller.decisions.decision_records import quantiles
from kdvfs.runtime.controller.decisions.sources import StepSource, ThreadContext
from kdvfs.runtime.controller.event_log import nanoseconds, step_line
from kdvfs.runtime.controller.measurement.accounting import Accounting
from kdvfs.runtime.controller.measurement.guard import Guard
from kdvfs.runtime.controller.model.run_summary import LeadIn
from kdvfs.runtime.controller.model.step_plan import StepPlan
from kdvfs.runtime.controller.shapes.steps import ShapeSteps, StepEntry
from kdvfs.runtime.controller.timing.anchors import Anchors
from kdvfs.runtime.controller.timing.gpu_timeline import StepEnd
from kdvfs.runtime.controller.timing.matching import StepMatcher
from kdvfs.runtime.device.errors import observe_only_reason
from kdvfs.runtime.job import JobGroup, JobStep, job_step

SCALE_STEPS = 5


@dataclass(frozen=True)
class StepJudges:
    """What judges each finished step: whether it matches the expected one (``matcher``), its A/B window and
    pair (``accounting``), and whether control must back off (``guard``)."""

    matcher: StepMatcher
    guard: Guard
    accounting: Accounting


class Issuer(threading.Thread):
    """See docs/design/controller.md. Feed it with ``queue.put(token)``; ``queue.put(None)`` ends it.

    Args:
        plan: the step's expected timeline (its expected and auto step times).
        context: the GPU timeline, host clock, event log and actuator.
        anchors: the step's anchors (learned from every finished step).
        source: what runs through each controlled step.
        judges: the matcher, guard and accounting each finished step goes to.
        job: the torchrun job the steps are reduced over (None: a single process).
    """

    def __init__(self, plan: StepPlan, context: ThreadContext, anchors: Anchors, source: StepSource,
                 judges: StepJudges, job: JobGroup | None = None, shapes: ShapeSteps | None = None) -> None:
        super().__init__(name="kdvfs-controller", daemon=True)
        self.context, self.job, self.shapes = context, job, shapes
        self._entry = StepEntry(plan, anchors, source)
        self._ran: dict[int, StepEntry | None] = {}
        """The entry each step decided so far runs with (a run whose steps vary; None: none, at auto)."""
        self.timeline, self.clock, self.log, self.actuator = (context.timeline, context.clock, context.log,
                                                              context.actuator)
        self.matcher, self.guard, self.accounting = judges.matcher, judges.guard, judges.accounting
        self._first_end_s = 0.0
        self.last_end_s: float | None = None
        """The last step's end (host s; None before the first)."""
        self.queue: queue.Queue[Any] = queue.Queue()
        self.stop_event = threading.Event()
        self.steps = 0
        self.controlled_steps = 0
        self.error: BaseException | None = None
        self._controlling = False
        self.cpu_s = 0.0
        """CPU time of this thread (s), once it stopped."""
        self.end_wait_cpu_s = self.issue_cpu_s = 0.0
        """Of it: waiting for the GPU to end each step (:meth:`StepTimeline.wait`), and running the source
        through the controlled steps (s)."""
        self._ratios: deque[float] = deque(maxlen=SCALE_STEPS)
        self._scale = 1.0
        """:attr:`scale`, found again when a ratio comes."""
        self._pace_logged: tuple[Array | None, list[int] | None, str | None] = (None, None, None)
        """The pace the last step record logged (the array), in nanoseconds and as JSON: kept while it is the
        same array (a pace learned anew is a new one)."""
        self.auto_reasons: Counter[str] = Counter()
        """Steps decided to run at auto, by reason (:meth:`_auto_reason`)."""
        self.lead_ins = self.lead_ins_missed = 0
        self.lead_in_late_s: list[float] = []
        """Lead-ins slept through; of them, those whose first anchor was not recorded by the give-up time, and how
        late the GPU passed it after its expected time, where it did (s)."""

    @property
    def plan(self) -> StepPlan:
        """The expected step the thread is working on (the next step's, once decided)."""
        return self._entry.plan

    @property
    def anchors(self) -> Anchors:
        return self._entry.anchors

    @property
    def source(self) -> StepSource:
        return self._entry.source

    @property
    def next_request_s(self) -> float:
        """Host time of the next request the thread may make (infinite when none is coming)."""
        return self.source.next_request_s

    @property
    def scale(self) -> float:
        """Measured over expected step time, median of the last matching steps (1 before any)."""
        return self._scale

    def run(self) -> None:
        """The thread: handle each step end queued by ``Controller.step`` until ``None``."""
        while True:
            token = self.queue.get()
            try:
                if token is None:
                    self.cpu_s = time.thread_time()
                    return
                if self.error is None:
                    self._window(token)
            except Exception as error:  # reported in the summary; the GPU goes back to auto
                self.error = error
                self.log.write("error", step=self.steps, message=str(error))
                self.actuator.close()
                reason = observe_only_reason(error)
                if reason is not None:
                    print(f"kdvfs: observe-only: {reason}; training continues at auto clocks", file=sys.stderr)
            finally:
                self.queue.task_done()

    def _judge(self, index: int, end: StepEnd, was_controlled: bool, ran: StepEntry | None) -> bool:
        """Feed finished step ``index`` (run with entry ``ran``) to the matcher, the accounting (over the job) and
        the guard; whether it matched (on every rank). In a run whose steps vary, durations are counted in
        reference steps (:meth:`ShapeSteps.weight`) and a step without an entry does not match."""
        weight = 1.0 if self.shapes is None or ran is None else self.shapes.weight(ran)
        duration_s = None if end.duration_s is None or ran is None else end.duration_s / weight
        local = self.matcher.observe(duration_s, end.signature if self.shapes is None else None)
        if index == 0:
            self._first_end_s = end.end_s
        job = job_step(self.job, JobStep(duration_s, local, self.accounting.window_elapsed_s(end.end_s),
                                         end.end_s - self._first_end_s))
        matched, now_s = job.matched, self._first_end_s + job.since_start_s
        if index == 0:
            self.accounting.start(end.end_s)
        elif job.duration_s is not None:
            slowdown_pct = self.accounting.step(index, job.duration_s, end.end_s, matched, was_controlled,
                                                job.window_elapsed_s, weight, end.host_pace_s)
            if slowdown_pct is not None and self.guard.observe(now_s) == Guard.BACK_OFF:
                self.log.write("backoff", step=index, reason=self.guard.reason)
            if slowdown_pct is not None:  # a new A/B pair: the run's slowdown moved
                self.source.feedback(self.accounting.slowdown.interval())
                if self.shapes is not None:
                    self.shapes.feedback(self.accounting.slowdown.interval())
        if self.guard.tick(now_s) == Guard.RESUME:
            self.log.write("resume", step=index)
        return matched

    def _window(self, token: Any) -> None:
        began_cpu_s = time.thread_time()
        end = self.timeline.wait(token, self._expected_end_s())
        self.end_wait_cpu_s += time.thread_time() - began_cpu_s
        self.last_end_s = end.end_s
        index, was_controlled = self.steps, self._controlling
        ran = self._ran.pop(index, self._entry if self.shapes is None else None)  # the first step had no decision
        self.steps += 1
        self.controlled_steps += was_controlled
        if was_controlled and ran is not None and self.shapes is not None:
            self.shapes.controlled(ran)
        matched = self._judge(index, end, was_controlled, ran)
        following = self._following(index + 1, end)
        self._controlling = following is not None and self._decide(end, matched, was_controlled, ran)
        self.accounting.next_step(self._controlling)  # before any sleep: a window edge held back is marked now
        if not self._controlling:
            self.auto_reasons[self._auto_reason(following, matched, ran)] += 1
        if self.source.sleeps_lead_in and self._controlling and was_controlled and following is ran:
            self._sleep_through_lead_in(index + 1, end)
        remapped = ran is not None and ran.anchors.learn(end, matched, was_controlled)
        if ran is not None:
            ran.source.observe(end, matched, was_controlled)  # after the pace and the map it places on
        self._log_step(index, end, matched, was_controlled, remapped)
        if following is not None:
            self._entry = following
        if self.stop_event.is_set():
            return
        if self._controlling:
            began_cpu_s = time.thread_time()
            first = not was_controlled or following is not ran
            lead_in = ((lambda: self._sleep_through_lead_in(index + 1, end))
                       if first and self.source.sleeps_lead_in else None)
            self.source.run(index + 1, end.end_s, self.scale, first, self.stop_event, lead_in)
            self.issue_cpu_s += time.thread_time() - began_cpu_s
        else:
            self.actuator.request(self.actuator.auto, step=index + 1, kernel=0, request_s=end.end_s, due_s=end.end_s)

    def _expected_end_s(self) -> float:
        """When the step waited for next is expected to end (host s): the last one's end and its expected
        time at the scale (none before the first end)."""
        if self.last_end_s is None:
            return -math.inf
        return self.last_end_s + self.scale * (self.plan.expected_s if self._controlling else self.plan.auto_s)

    def _log_step(self, index: int, end: StepEnd, matched: bool, was_controlled: bool, remapped: bool) -> None:
        """The step's record (and the anchor map's, when it changed) in the event log."""
        pace = self.anchors.pace.segments_s
        if pace is not self._pace_logged[0]:  # the pace learned anew (a new array), or another step's
            pace_ns = None if pace is None else nanoseconds(pace.tolist())
            self._pace_logged = (pace, pace_ns, None if pace_ns is None else str(pace_ns))
        _, pace_ns, pace_json = self._pace_logged
        self.log.write_line(step_line(index, end.end_s, end.duration_s, end.signature, matched, was_controlled,
                                      self._controlling, self.scale, self.accounting.slot.arm,
                                      nanoseconds(end.anchors_s), pace_ns, pace_json))
        if remapped:
            anchors = self.anchors.map.anchors
            self.log.write("anchor_map", step=index, kernels=[a.kernel for a in anchors],
                           positions_s=[a.position_s for a in anchors], mapped_by=self.anchors.map.mapped_by)

    def _sleep_through_lead_in(self, step: int, end: StepEnd) -> None:
        """Sleep until the GPU is expected at step ``step``'s first anchor, if the pace is learned, then wait until
        it has passed it (docs/design/controller.md): the rest of the previous step's bookkeeping and the source's
        decisions wait until then."""
        segments_s = self.anchors.pace.for_anchors(len(self.anchors.map.anchors))
        if segments_s is None:
            return
        expected_s = end.end_s + float(segments_s[0])
        if not self.clock.sleep_until(expected_s, self.stop_event):
            return
        give_up_s = expected_s + self.anchors.tolerance * self.scale * self.plan.expected_s
        passed_s = self.timeline.anchor_s(step, 0, give_up_s)
        self.lead_ins += 1
        if passed_s is None:
            self.lead_ins_missed += 1
        elif passed_s > expected_s:
            self.lead_in_late_s.append(passed_s - expected_s)

    def step_interval_s(self) -> float | None:
        """The mean time from one step end to the next so far (host s; None before two)."""
        if self.last_end_s is None or self.steps < 2:
            return None
        return (self.last_end_s - self._first_end_s) / (self.steps - 1)

    def lead_in_figures(self) -> LeadIn:
        """For the summary: the lead-ins slept through, those whose first anchor came late (and by how much, s),
        and those whose first anchor never came (docs/design/controller.md)."""
        return LeadIn(self.lead_ins, len(self.lead_in_late_s), self.lead_ins_missed, quantiles(self.lead_in_late_s))

    def _following(self, step: int, end: StepEnd) -> StepEntry | None:
        """The entry step ``step`` will run with: the one entry, or (steps that vary) its shape's, waiting for the
        shape at most one expected step past ``end`` (None: none; the step runs at auto)."""
        if self.shapes is None:
            return self._entry
        following = self.shapes.entry(step, end.end_s + self.scale * self.plan.auto_s)
        self._ran[step] = following
        if following is None:
            self.log.write("off_script", step=step)
        return following

    def _auto_reason(self, following: StepEntry | None, matched: bool, ran: StepEntry | None) -> str:
        """Why the next step runs at auto: its shape has no plan (``no_plan``; ``no_shape``: not known in time),
        the step before it had none (``after_off_script``: its pace is unknown), the step did not match
        (``mismatch``), the guard backed off (``guard``), or an auto window of the A/B measurement (``ab_window``)."""
        if following is None:
            return self.shapes.last_miss if self.shapes is not None else "no_plan"
        if ran is None:
            return "after_off_script"
        if not matched:
            return "mismatch"
        return "guard" if self.guard.backed_off else "ab_window"

    def _decide(self, end: StepEnd, matched: bool, was_controlled: bool, ran: StepEntry | None) -> bool:
        """Whether the next step is controlled, after this one (docs/design/controller.md)."""
        if not matched or end.duration_s is None or ran is None:
            if was_controlled:
                self.log.write("mismatch", step=self.steps - 1, duration_s=end.duration_s, signature=end.signature)
            return False
        self._ratios.append(end.duration_s / (ran.plan.expected_s if was_controlled else ran.plan.auto_s))
        self._scale = statistics.median(self._ratios)
        return self.accounting.next_controlled and not self.guard.backed_off
