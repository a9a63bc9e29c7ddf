"""The controller's thread and its parts, wired from what :mod:`~kdvfs.runtime.controller.control.opening` opened: the
actuator, the accounting, the GPU timeline (CUDA events; the host's in ``cpu_test_mode``; a controller in a process
of its own reads the training process's: :class:`RemoteTimeline`), the anchor hooks (CUDA only, with ``anchors``; in
a process of its own the training process's, :class:`RemoteHooks`), the anchors, the step source (the online policy
where the plan carries one, else the schedule replayed), the shape entries of a run whose steps vary (with an online
policy: each bucket's policy prepared on the book's thread:
:mod:`kdvfs.runtime.controller.shapes.bucket_decisions`), and the matcher, guard and accounting that judge each
step. Builds only: starting the thread and installing the hooks is the controller's, and so is closing them."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from kdvfs.agents.common.problem import Problem
from kdvfs.envs.trace.shape import StepShape
from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.control.issuer import Issuer, StepJudges
from kdvfs.runtime.controller.control.opening import Opened
from kdvfs.runtime.controller.control.remote_timeline import RemoteHooks, RemoteTimeline
from kdvfs.runtime.controller.decisions.actuator import Actuator
from kdvfs.runtime.controller.decisions.sources import ReplayedSchedule, StepSource, ThreadContext
from kdvfs.runtime.controller.event_log import EventLog
from kdvfs.runtime.controller.measurement.accounting import Accounting
from kdvfs.runtime.controller.measurement.guard import Guard
from kdvfs.runtime.controller.model.plan import bucket_planner
from kdvfs.runtime.controller.model.step_plan import StepPlan
from kdvfs.runtime.controller.shapes.book import ShapeBook, ShapePlan, kernel_time_s
from kdvfs.runtime.controller.shapes.steps import ShapeSteps, StepEntry, VaryingSteps
from kdvfs.runtime.controller.timing.anchor_hooks import AnchorHooks
from kdvfs.runtime.controller.timing.anchors import Anchors, TraceStructure
from kdvfs.runtime.controller.timing.gpu_events.recorder import EventRecorder
from kdvfs.runtime.controller.timing.gpu_timeline import BoardTimeline, StepTimeline, local_timeline
from kdvfs.runtime.controller.timing.matching import StepMatcher
from kdvfs.runtime.device.host_time import Clock, CountingClock
from kdvfs.runtime.job import JobGroup

Hooks = AnchorHooks | RemoteHooks
"""The anchor hooks: this process's, or those of the training process a controller in its own process serves."""


def anchor_hooks(config: ControllerConfig, timeline: StepTimeline) -> AnchorHooks | None:
    """The anchor hooks recording on ``timeline`` (CUDA only, with ``anchors``; None: none)."""
    recorder = timeline.recorder if isinstance(timeline, BoardTimeline) else None
    if config.timing.anchors and isinstance(recorder, EventRecorder):
        return AnchorHooks(recorder.anchor, config.timing.anchor_every)
    return None


@dataclass(frozen=True)
class ThreadParts:
    """The controller's running parts (see the module docstring); ``thread_clock`` counts the thread's sleeps."""

    issuer: Issuer
    actuator: Actuator
    accounting: Accounting
    timeline: StepTimeline
    hooks: Hooks | None
    source: StepSource
    shapes: ShapeSteps | None
    thread_clock: CountingClock


def shape_book(opened: Opened, varying: VaryingSteps, stack: contextlib.ExitStack) -> ShapeBook:
    """The plans of the shape buckets of a run whose steps vary, at the plan's GPU, budget and latency (its
    worker processes closed by ``stack``)."""
    book = varying.plan(opened.plan.problem, bucket_planner(opened.plan, opened.config))
    stack.callback(book.close)
    return book


class ThreadBuilder:
    """Builds the :class:`ThreadParts` of ``opened`` on host clock ``clock``, writing to ``log``; ``book`` and
    ``varying``: the shape buckets of a run whose steps vary (None: a run of one shape)."""

    def __init__(self, opened: Opened, clock: Clock, log: EventLog, book: ShapeBook | None = None,
                 varying: VaryingSteps | None = None) -> None:
        self.opened, self.clock, self.log, self.book, self.varying = opened, clock, log, book, varying

    def build(self, timeline: StepTimeline | None, job: JobGroup | None, stack: contextlib.ExitStack) -> ThreadParts:
        """The parts on ``timeline`` (None: the GPU's CUDA events, or the host's in ``cpu_test_mode``), the steps
        reduced over ``job``; the actuator is closed by ``stack``."""
        opened, clock = self.opened, self.clock
        config, plan, problem = opened.config, opened.step_plan, opened.plan.problem
        actuator = Actuator(opened.device, config.dry_run, problem.profile.clocks.default_memory_mhz, self.log,
                            clock, problem.latency_s)
        stack.callback(actuator.close)
        issuers: list[Issuer] = []
        accounting = Accounting(opened.device if config.measurement.energy else None, clock, config,
                                1 + int(problem.latency_s // plan.auto_s), self.log,
                                lambda: issuers[0].next_request_s if issuers else math.inf)
        if timeline is None:
            timeline = local_timeline(clock, config.cpu_test_mode)
            stack.callback(timeline.stop)
        hooks: Hooks | None = timeline.hooks if isinstance(timeline, RemoteTimeline) else anchor_hooks(config, timeline)
        anchors = self._anchors(timeline, hooks)
        thread_clock = CountingClock(clock)
        context = ThreadContext(timeline, thread_clock, self.log, actuator)
        source = self._step_source(anchors, context)
        shapes = None if self.book is None else self._shape_steps(timeline, hooks, context)
        if shapes is not None:
            accounting.covariates = shapes.covariates
            self._decide_buckets_online(shapes, source)
        issuers.append(Issuer(plan, context, anchors, source, self._judges(accounting, shapes), job, shapes))
        return ThreadParts(issuers[0], actuator, accounting, timeline, hooks, source, shapes, thread_clock)

    def _judges(self, accounting: Accounting, shapes: ShapeSteps | None) -> StepJudges:
        """The matcher (any known duration matches in a run whose steps vary), the guard and the accounting."""
        config, plan = self.opened.config, self.opened.step_plan
        matcher = (StepMatcher(plan.auto_s, config.step_match_tolerance, config.timing.confirm_steps)
                   if shapes is None else StepMatcher(shapes.reference_kernel_s, math.inf,
                                                      config.timing.confirm_steps))
        measurement = config.measurement
        guard = Guard(config.budget, measurement.guard_margin, measurement.guard_min_pairs, measurement.guard_retry_s,
                      accounting.slowdown.interval, lambda: len(accounting.windows), config.guard_off())
        return StepJudges(matcher, guard, accounting)

    def _anchors(self, timeline: StepTimeline, hooks: Hooks | None, step: tuple[Problem, StepPlan] | None = None
                 ) -> Anchors:
        """The anchors of ``step`` (default: the plan's): learned from ``hooks``' events (mapped by the trace's
        structure where it fits), and where the requests are placed (:mod:`kdvfs.runtime.controller.timing.anchors`)."""
        config, plan = self.opened.config, self.opened.plan
        problem, step_plan = step or (plan.problem, self.opened.step_plan)
        structure = None if hooks is None else TraceStructure(problem.trace, hooks.every, lambda: hooks.blocks).kernels
        return Anchors(step_plan, timeline, self.clock, problem.latency_s, config.timing.anchor_margin_s,
                       config.step_match_tolerance, learn_auto=config.dry_run,
                       pace_from_auto=plan.online is not None and not config.dry_run, structure=structure)

    def _shape_steps(self, timeline: StepTimeline, hooks: Hooks | None, context: ThreadContext) -> ShapeSteps:
        """One entry per bucket of the book (its plan replayed on its own anchors) and the step-to-entry map;
        the buckets the book plans in the background join it as they come."""
        book, varying, config = self.book, self.varying, self.opened.config
        assert book is not None and varying is not None

        def entries(top: StepShape, shape_plans: tuple[ShapePlan, ...]) -> tuple[StepEntry, ...]:
            margins = []
            for shape_plan in shape_plans:
                step_plan = StepPlan.build(shape_plan.problem, shape_plan.schedule, config.dry_run)
                anchors = self._anchors(timeline, hooks, (shape_plan.problem, step_plan))
                source = ReplayedSchedule(step_plan, anchors, context, shape_plan.problem.latency_s,
                                          config.timing.issue_early_s)
                margins.append(StepEntry(step_plan, anchors, source, top.key, kernel_time_s(shape_plan.problem)))
            return tuple(margins)

        shapes = ShapeSteps(book, {top: entries(top, plans) for top, plans in book.plans.items()}, varying.shape_of,
                            kernel_time_s(self.opened.plan.problem), config.budget, varying.kernel_time_s,
                            varying.step_model_basis, varying.new_inputs)

        def planned(top: StepShape, shape_plans: tuple[ShapePlan, ...], solve_s: float) -> None:
            """A bucket planned in the background joins the run; the log says when and how long its solve took (a
            worker's solve competes with the training process for the host's cores: set beside the steps' times)."""
            shapes.add(top, entries(top, shape_plans))
            self.log.write("bucket_planned", bucket=top.key, end_s=self.clock.now_s(), solve_s=solve_s)

        book.on_plan = planned
        return shapes

    def _decide_buckets_online(self, shapes: ShapeSteps, source: StepSource) -> None:
        """With an online policy, each bucket's entries decide online once its policy is prepared on the book's
        thread (:mod:`kdvfs.runtime.controller.shapes.bucket_decisions`), through ``source``."""
        from kdvfs.runtime.controller.decisions.online import OnlineSteps
        from kdvfs.runtime.controller.shapes.bucket_decisions import bucket_policy, online_entries

        online, book = self.opened.plan.online, self.book
        if online is None or book is None or not isinstance(source, OnlineSteps):
            return

        def prepare(top: StepShape, plans: tuple[ShapePlan, ...]) -> None:
            policy = bucket_policy(online, plans[0].problem)
            shapes.add(top, online_entries(source, policy, shapes.entries[top], book.margins))

        book.prepare_buckets(prepare)

    def _step_source(self, anchors: Anchors, context: ThreadContext) -> StepSource:
        """What runs through the controlled steps (:mod:`kdvfs.runtime.controller.decisions.sources`): the
        online policy, where the plan carries one, else the plan's schedule replayed."""
        plan, config, step_plan = self.opened.plan, self.opened.config, self.opened.step_plan
        if plan.online is None:
            return ReplayedSchedule(step_plan, anchors, context, plan.problem.latency_s,
                                    config.timing.issue_early_s)
        from kdvfs.runtime.controller.decisions.live_clocks import LiveClocks
        from kdvfs.runtime.controller.decisions.online import OnlineSettings, OnlineSteps
        from kdvfs.runtime.controller.decisions.online_step import OnlineStep

        online, problem = plan.online, plan.problem
        clocks = LiveClocks(online, context.actuator, self.opened.device, problem.latency_s, online.latency_std_s,
                            config.dry_run)
        online.prepare()
        settings = OnlineSettings(
            budget=problem.budget, job_budget=config.budget,
            dry_run=config.dry_run, interval_s=max(online.decision_interval_s, config.online.interval_s),
            early_s=config.timing.issue_early_s, warm_up=config.online.warm_up,
            sleep_lead_in=config.online.sleep_lead_in)
        return OnlineSteps(OnlineStep(online, anchors, step_plan.expected_s), clocks, context, settings)
