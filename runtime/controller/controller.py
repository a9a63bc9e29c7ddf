"""The predictive clock controller's Python API: a context manager with ``.step()`` once per training step.

    from kdvfs.runtime.controller import Controller

    with Controller("plan.json", "step.trace.json", dry_run=True, log="kdvfs-run.jsonl") as controller:
        for batch in loader:
            train_step(batch)
            controller.step()
    print(controller.summary)

On entry it opens the GPU (NVML; through ``kdvfs daemon`` when ``daemon`` or ``KDVFS_DAEMON`` names its socket,
:class:`~kdvfs.runtime.daemon.client.DaemonDevice`; or the device it is given), computes the step's schedule
once from the plan or policy file (:mod:`kdvfs.runtime.controller.model.plan`), checks that the profile is
this GPU's, that every clock of the schedule is supported and, unless ``dry_run``, that this process may lock
clocks (through the daemon: that it leased the GPU) and takes the GPU's lease (:mod:`kdvfs.runtime.device.lease`:
one owner per GPU; released after the clocks are restored);
then it starts the watchdog process (not in a dry run, nor through the daemon, which holds the lease and resets
the GPU when this process's connection ends; it shares the lease) and its background thread
(:mod:`kdvfs.runtime.controller.control.issuer`), which runs the step source
(:mod:`kdvfs.runtime.controller.decisions.sources`: the schedule replayed, or the online policy) through the
controlled steps. Under torchrun each rank's controller opens its own GPU (CUDA device ``LOCAL_RANK``), its
own trace and plan where they exist (:meth:`ControllerConfig.for_rank`) and its own watchdog, and joins the
job's gloo group (:class:`kdvfs.runtime.job.JobGroup`) through which the steps are reduced for the accounting
and guard. A check that fails raises before any clock changed. ``step()`` records a CUDA event and reads the
caching allocator's counter (no GPU sync); with ``anchors`` (the default) hooks record CUDA events inside the
step too (:mod:`kdvfs.runtime.controller.timing.anchor_hooks`), on which the thread places the step's requests. On
exit, on an exception, on SIGINT (as KeyboardInterrupt) and SIGTERM (as SystemExit) it stops the thread,
returns the clocks to the GPU, stops the watchdog and builds :attr:`summary`.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import subprocess
import sys
import threading
import types
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kdvfs.agents.common.problem import Problem, score
from kdvfs.agents.evaluation.ranges import predicted_range
from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.control.issuer import Issuer, StepJudges
from kdvfs.runtime.controller.decisions.actuator import Actuator, parse_clocks
from kdvfs.runtime.controller.decisions.sources import ReplayedSchedule, StepSource, ThreadContext
from kdvfs.runtime.controller.event_log import EventLog
from kdvfs.runtime.controller.measurement.accounting import Accounting
from kdvfs.runtime.controller.measurement.guard import Guard
from kdvfs.runtime.controller.measurement.host_cost import host_cost
from kdvfs.runtime.controller.model.plan import Plan, bucket_planner, load_plan
from kdvfs.runtime.controller.model.step_plan import StepPlan
from kdvfs.runtime.controller.shapes.book import ShapeBook, ShapePlan, kernel_time_s
from kdvfs.runtime.controller.shapes.steps import ShapeSteps, StepEntry, VaryingSteps
from kdvfs.runtime.controller.timing.anchor_hooks import AnchorHooks
from kdvfs.runtime.controller.timing.anchors import Anchors, TraceStructure
from kdvfs.runtime.controller.timing.gpu_timeline import CudaStepTimeline, HostStepTimeline, StepTimeline
from kdvfs.runtime.controller.timing.matching import StepMatcher
from kdvfs.runtime.controller.training.ended import write_daemon_lease
from kdvfs.runtime.daemon.client import NVML_CONTROL, DaemonDevice, daemon_socket
from kdvfs.runtime.device.errors import observe_only_reason
from kdvfs.runtime.device.host_time import Clock, CountingClock, RealClock
from kdvfs.runtime.device.interface import Device, check_clocks_mhz
from kdvfs.runtime.device.lease import GpuLease
from kdvfs.runtime.device.nvml import NvmlDevice, import_nvml, require_clock_permission, terminate_on_sigterm
from kdvfs.runtime.device.visible import rank_gpu_index
from kdvfs.runtime.device.watchdog import spawn_watchdog, stop_watchdog, watchdog_outcome_path
from kdvfs.runtime.job import JobGroup, Rank, rank_path

if TYPE_CHECKING:
    from kdvfs.envs.trace.shape import StepShape
    from kdvfs.runtime.controller.shapes.varying import StepShapes

STOP_TIMEOUT_S = 5.0
RUN_NEEDS = "the clock controller locks GPU clocks"
RUN_FIX = ("run it as root, or through a kdvfs daemon (--daemon SOCKET or KDVFS_DAEMON; docs/daemon.md), or add "
           "--dry-run to see what it would do without changing clocks")


def check_device(plan: Plan, device: Device) -> None:
    """Raise unless ``device`` supports each clock of ``plan``'s schedule (and of its online policy's grid)."""
    supported = device.supported_clocks_mhz()
    labels = {plan.problem.costs.label(int(a)) for a in plan.schedule.actions}
    for label in sorted(labels | set(plan.online.labels if plan.online is not None else ())):
        core_mhz, mem_mhz = parse_clocks(label)
        check_clocks_mhz(supported, core_mhz, mem_mhz, f"GPU {device.index} ({device.name})")


def clock_control_of(device: Device) -> str:
    """How ``device`` changes clocks, as summaries report it: ``nvml`` (this process, as root), ``daemon:PATH``
    (through the daemon at PATH), or ``device:CLASS`` for another device handed to the controller (tests)."""
    if isinstance(device, DaemonDevice):
        return device.clock_control
    return NVML_CONTROL if isinstance(device, NvmlDevice) else f"device:{type(device).__name__}"


class Controller:
    """See the module docstring. ``policy``, ``trace`` and ``options`` make a :class:`ControllerConfig`
    (:meth:`ControllerConfig.from_options`: its fields, and each group's by their flat names, e.g. ``window_s``,
    ``anchor_every``, ``online``); or pass ``config``.

    ``device``, ``timeline`` and ``clock`` replace the GPU (NVML), its CUDA-event timeline and the host clock;
    tests pass a :class:`~kdvfs.runtime.testing.fake_gpu.FakeGpu` with its timeline and virtual clock, explicitly.
    ``varying``: the captured shapes of a run whose steps vary, the step model's prediction and where each step's
    shape comes from (:class:`VaryingSteps`); with it every step is planned by its shape
    (:mod:`kdvfs.runtime.controller.shapes.steps`).
    """

    def __init__(self, policy: str | None = None, trace: str | None = None, *, config: ControllerConfig | None = None,
                 device: Device | None = None, timeline: StepTimeline | None = None, clock: Clock | None = None,
                 varying: VaryingSteps | None = None, **options: Any) -> None:
        if config is None:
            if policy is None or trace is None:
                raise TypeError("Controller needs a policy (or plan) and the expected trace, or a config")
            config = ControllerConfig.from_options(str(policy), str(trace), **options)
        self.config = config
        self.summary: dict[str, Any] | None = None
        self.plan: Plan | None = None
        self.step_plan: StepPlan | None = None
        self._device, self._timeline, self._clock = device, timeline, clock or RealClock()
        self._stack = contextlib.ExitStack()
        self._issuer: Issuer | None = None
        self._actuator: Actuator | None = None
        self._accounting: Accounting | None = None
        self._hooks: AnchorHooks | None = None
        self._source: StepSource | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._log = EventLog(None)
        self.rank = Rank.from_environment()
        self._job: JobGroup | None = None
        self._gpu_index: int | None = None
        self._opened: Device | None = None
        self._varying = varying
        self.book: ShapeBook | None = None
        """The plans of the shape buckets of a run whose steps vary (None for a run of one shape)."""
        self._shapes: ShapeSteps | None = None
        self._step_shapes: StepShapes | None = None
        self._clock_control = NVML_CONTROL
        self._thread_clock = CountingClock(self._clock)
        self._fake_nvml = False

    def __enter__(self) -> Controller:
        try:
            self._open()
        except BaseException:
            self._stack.close()
            raise
        atexit.register(self.close)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: types.TracebackType | None) -> None:
        self.close()

    def _open_device(self) -> Device:
        """The GPU: the device given, or GPU ``gpu_index`` (default: this rank's, CUDA device ``LOCAL_RANK``)
        through the daemon when ``daemon`` (else ``KDVFS_DAEMON``) names its socket, else through NVML."""
        if self._device is not None:
            return self._device
        nvml = import_nvml(self.config.nvml_module)
        self._fake_nvml = bool(getattr(nvml, "FAKE_NVML", False))  # kdvfs.runtime.testing.nvml
        index = rank_gpu_index(nvml) if self.config.gpu_index is None else self.config.gpu_index
        self.config = replace(self.config, gpu_index=index, daemon=daemon_socket(self.config.daemon))
        energy = self.config.measurement.energy
        if self.config.daemon is not None:
            return self._stack.enter_context(DaemonDevice(self.config.daemon, index, nvml, check_energy=energy))
        return self._stack.enter_context(NvmlDevice(index, nvml, check_energy=energy))

    def _open(self) -> None:
        self.config = self.config.for_rank(self.rank)
        device = self._opened = self._open_device()
        self._gpu_index = device.index
        self._clock_control = clock_control_of(device)
        config = self.config
        self.plan = load_plan(config, device.name)
        check_device(self.plan, device)
        if not config.dry_run:
            require_clock_permission(needs=RUN_NEEDS, fix=RUN_FIX, allowed=device.has_clock_permission())
            if isinstance(device, DaemonDevice) and config.report_path:  # for `kdvfs run`, should this process die
                write_daemon_lease(self._report_path(), device.socket_path, device.index)
        problem = self.plan.problem
        config.measurement.check_window(problem.latency_s)
        self.step_plan = StepPlan.build(problem, self.plan.schedule, config.dry_run)
        if self._varying is None:
            from kdvfs.runtime.controller.shapes.varying import varying_steps

            found = varying_steps(config.trace, self._clock)
            if found is not None:
                self._varying, self._step_shapes = found
        if self._varying is not None:
            self.book = self._varying.plan(problem, bucket_planner(self.plan, config))
            self._stack.callback(self.book.close)
        if threading.current_thread() is threading.main_thread():
            self._stack.enter_context(terminate_on_sigterm())
        if not config.dry_run and isinstance(device, NvmlDevice):
            lease = self._stack.enter_context(GpuLease(device.uuid(), device.index))  # released after the watchdog
            if config.watchdog:
                lease_fds = () if lease.fd is None else (lease.fd,)
                self._watchdog = spawn_watchdog(device.index, config.nvml_module, self._watchdog_outcome(), lease_fds)
                self._stack.callback(self._stop_watchdog)
        self._log = EventLog(config.log)
        self._stack.callback(self._log.close)
        if self.rank.distributed:
            self._job = JobGroup(self.rank)
            self._stack.callback(self._job.close)  # after everything started later (the issuer uses it)
        self._log.write("start", clock="perf_counter", rank=self.rank.rank, gpu_index=device.index, pid=os.getpid(),
                        source=self.plan.source, gpu=problem.profile.name,
                        trace=problem.trace.meta.workload, dry_run=config.dry_run, latency_s=problem.latency_s,
                        expected_s=self.step_plan.expected_s, auto_s=self.step_plan.auto_s,
                        anchor_margin_s=config.timing.anchor_margin_ms / 1e3 if config.timing.anchors else None,
                        changes=len(self.step_plan.kernels))
        self._start_thread(device)

    def _start_thread(self, device: Device) -> None:
        config, plan, clock = self.config, self.step_plan, self._clock
        assert plan is not None and self.plan is not None
        self._actuator = Actuator(device, config.dry_run, self.plan.problem.profile.clocks.default_memory_mhz,
                                  self._log, clock, self.plan.problem.latency_s)
        self._stack.callback(self._actuator.close)
        settle_steps = 1 + int(self.plan.problem.latency_s // plan.auto_s)
        meter = device if config.measurement.energy else None
        self._accounting = Accounting(meter, clock, config, settle_steps, self._log, self._next_request_s)
        timeline = self._timeline or (HostStepTimeline(clock) if config.cpu_test_mode else CudaStepTimeline(clock))
        hooks = (AnchorHooks(timeline.anchor, config.timing.anchor_every)
                 if config.timing.anchors and isinstance(timeline, CudaStepTimeline) else None)
        anchors = self._anchors(timeline, hooks)
        self._thread_clock = CountingClock(clock)
        context = ThreadContext(timeline, self._thread_clock, self._log, self._actuator)
        self._source = self._step_source(device, anchors, context)
        self._shapes = None if self.book is None else self._shape_steps(timeline, hooks, context)
        matcher = (StepMatcher(plan.auto_s, config.step_match_tolerance, config.timing.confirm_steps)
                   if self._shapes is None else StepMatcher(self._shapes.reference_kernel_s, math.inf,
                                                             config.timing.confirm_steps))
        accounting = self._accounting
        if self._shapes is not None:
            accounting.covariates = self._shapes.covariates
        judges = StepJudges(matcher,
                            Guard(config.budget, config.measurement.guard_margin, config.measurement.guard_min_pairs,
                                  config.measurement.guard_retry_s, accounting.slowdown.interval,
                                  lambda: len(accounting.windows), config.guard_off()),
                            accounting)
        self._issuer = Issuer(plan, context, anchors, self._source, judges, self._job, self._shapes)
        self._timeline = timeline
        self._issuer.start()
        self._stack.callback(self._stop_thread)
        if self._step_shapes is not None:
            self._step_shapes.probe.install()
            self._stack.callback(self._step_shapes.probe.remove)
        if hooks is not None:
            self._hooks = hooks
            self._hooks.install()
            self._stack.callback(self._hooks.remove)

    def _anchors(self, timeline: StepTimeline, hooks: AnchorHooks | None, step: tuple[Problem, StepPlan] | None = None
                 ) -> Anchors:
        """The anchors of ``step`` (default: the plan's): learned from ``hooks``' events (mapped by the trace's
        structure where it fits), and where the requests are placed (:mod:`kdvfs.runtime.controller.timing.anchors`)."""
        config, plan = self.config, self.plan
        assert plan is not None and self.step_plan is not None
        problem, step_plan = step or (plan.problem, self.step_plan)
        structure = None if hooks is None else TraceStructure(problem.trace, hooks.every, lambda: hooks.blocks).kernels
        return Anchors(step_plan, timeline, self._clock, problem.latency_s, config.timing.anchor_margin_s,
                       config.step_match_tolerance, learn_auto=config.dry_run,
                       pace_from_auto=plan.online is not None and not config.dry_run, structure=structure)

    def _shape_steps(self, timeline: StepTimeline, hooks: AnchorHooks | None, context: ThreadContext) -> ShapeSteps:
        """One entry per bucket of the book (its plan replayed on its own anchors) and the step-to-entry map;
        the buckets the book plans in the background join it as they come."""
        book, varying = self.book, self._varying
        assert book is not None and varying is not None and self.plan is not None

        def entries(top: StepShape, shape_plans: tuple[ShapePlan, ...]) -> tuple[StepEntry, ...]:
            margins = []
            for shape_plan in shape_plans:
                step_plan = StepPlan.build(shape_plan.problem, shape_plan.schedule, self.config.dry_run)
                anchors = self._anchors(timeline, hooks, (shape_plan.problem, step_plan))
                source = ReplayedSchedule(step_plan, anchors, context, shape_plan.problem.latency_s,
                                          self.config.timing.issue_early_ms / 1e3)
                margins.append(StepEntry(step_plan, anchors, source, top.key, kernel_time_s(shape_plan.problem)))
            return tuple(margins)

        shapes = ShapeSteps(book, {top: entries(top, plans) for top, plans in book.plans.items()}, varying.shape_of,
                            kernel_time_s(self.plan.problem), 100 * self.config.budget, varying.kernel_time_s)
        book.on_plan = lambda top, plans: shapes.add(top, entries(top, plans))
        return shapes

    def _step_source(self, device: Device, anchors: Anchors, context: ThreadContext) -> StepSource:
        """What runs through the controlled steps (:mod:`kdvfs.runtime.controller.decisions.sources`): the
        online policy, where the plan carries one, else the plan's schedule replayed."""
        plan, config = self.plan, self.config
        assert plan is not None and self.step_plan is not None
        if plan.online is None:
            return ReplayedSchedule(self.step_plan, anchors, context, plan.problem.latency_s,
                                    config.timing.issue_early_ms / 1e3)
        from kdvfs.runtime.controller.decisions.live_clocks import LiveClocks
        from kdvfs.runtime.controller.decisions.online import OnlineSettings, OnlineSteps

        online, problem = plan.online, plan.problem
        clocks = LiveClocks(online, context.actuator, device, problem.latency_s, online.latency_std_s, config.dry_run)
        online.prepare()
        settings = OnlineSettings(
            expected_s=self.step_plan.expected_s, budget=problem.budget, job_budget=config.budget,
            dry_run=config.dry_run, interval_s=max(online.decision_interval_s, config.online.interval_ms / 1e3),
            early_s=config.timing.issue_early_ms / 1e3, warm_up=config.online.warm_up,
            sleep_lead_in=config.online.sleep_lead_in)
        return OnlineSteps(online, clocks, anchors, context, settings)

    def _report_path(self) -> Path:
        """This process's report for ``kdvfs run`` (``report_path`` is set)."""
        assert self.config.report_path is not None
        return rank_path(self.config.report_path, self.rank.rank) if self.rank.distributed \
            else Path(self.config.report_path)

    def _watchdog_outcome(self) -> str | None:
        """The file the watchdog reports its state to, beside this process's report for ``kdvfs run``."""
        return str(watchdog_outcome_path(self._report_path())) if self.config.report_path else None

    def _next_request_s(self) -> float:
        return math.inf if self._issuer is None else self._issuer.next_request_s

    def step(self) -> None:
        """Mark the end of a training step (call it once per optimizer step)."""
        issuer = self._issuer
        if self._step_shapes is not None:
            self._step_shapes.mark_step()
        if issuer is not None and issuer.is_alive() and issuer.error is None:
            assert self._timeline is not None
            issuer.queue.put(self._timeline.mark())

    def flush(self) -> None:
        """Block until the background thread has handled every step marked so far."""
        if self._issuer is not None and self._issuer.is_alive():
            self._issuer.queue.join()

    def _stop_thread(self) -> None:
        issuer = self._issuer
        assert issuer is not None
        issuer.stop_event.set()
        issuer.queue.put(None)
        issuer.join(STOP_TIMEOUT_S)
        if self._actuator is not None:
            self._actuator.close()
        restored = self._stop_watchdog()
        if self._accounting is not None:
            self._accounting.close()
        self.summary = {**self._summary(), "gpu_restored": restored}
        self._log.write("summary", **self.summary)
        if not restored:
            print(f"kdvfs: {self.summary['restore_error']}", file=sys.stderr)

    def _stop_watchdog(self) -> bool:
        """Stop the watchdog, which resets the clocks itself when the actuator's restore failed (idempotent);
        True when the GPU is back at its own control."""
        restored = self._actuator is None or self._actuator.restored
        return restored if self._watchdog is None else stop_watchdog(self._watchdog, restored)

    @property
    def windows(self) -> list[dict[str, Any]]:
        """The run's A/B windows (:class:`~kdvfs.runtime.controller.measurement.accounting.Window` fields and
        ``as_intended``)."""
        if self._accounting is None:
            return []
        return [{**asdict(w), "as_intended": w.as_intended} for w in self._accounting.windows]

    def close(self) -> None:
        """Restore the clocks and stop everything (idempotent); what ``__exit__`` does.

        A failed restore (tried by the actuator, then by the watchdog) does not raise: it is one line on stderr
        naming the GPU and ``sudo kdvfs reset --gpu-index I``, and the summary's ``restore_error`` and
        ``gpu_restored``; everything else is still stopped and the summary still built.
        """
        atexit.unregister(self.close)
        self._stack.close()

    def _connection_error(self) -> str | None:
        """The error that ended a daemon connection (a restore confirmed by a restarted daemon, say), or None."""
        device = self._opened
        return str(device.connection_error) if isinstance(device, DaemonDevice) and device.connection_error else None

    def _summary(self) -> dict[str, Any]:
        issuer, actuator, accounting, plan = self._issuer, self._actuator, self._accounting, self.plan
        assert issuer is not None and actuator is not None and accounting is not None and plan is not None
        predicted = score(plan.problem, plan.schedule)
        guard = issuer.guard.slowdown()
        cuda = self._timeline if isinstance(self._timeline, CudaStepTimeline) else None
        return {
            "rank": self.rank.rank, "world_size": self.rank.world_size, "gpu_index": self._gpu_index,
            "source": plan.source, "gpu": plan.problem.profile.name, "trace": plan.problem.trace.meta.workload,
            "dry_run": self.config.dry_run, "clock_control": self._clock_control, "steps": issuer.steps,
            "controlled_steps": issuer.controlled_steps,
            "switches": actuator.switches, "mismatches": issuer.matcher.mismatches,
            "backed_off": issuer.guard.backoffs > 0, "backoff_reason": issuer.guard.reason,
            "guard_backoffs": issuer.guard.backoffs, "guard_slowdown_pct": None if guard is None else guard.mean_pct,
            "guard_off": issuer.guard.off, "not_measured_on_a_gpu": self.config.not_measured_on_a_gpu(self._fake_nvml),
            "error": str(issuer.error) if issuer.error is not None else self._connection_error(),
            "observe_only": observe_only_reason(issuer.error),
            "restore_error": None if actuator.restore_error is None else str(actuator.restore_error),
            "anchors": {**issuer.anchors.figures(), "blocks": None if self._hooks is None else self._hooks.blocks},
            **issuer.source.summary(),
            "shapes": None if self._shapes is None else self._shapes.figures(),
            "auto_reasons": dict(sorted(issuer.auto_reasons.items())),
            "lead_in": issuer.lead_in_figures(),
            "controller_cpu_ms": {"thread": 1e3 * issuer.cpu_s, "thread_end_wait": 1e3 * issuer.end_wait_cpu_s,
                                  "thread_issue": 1e3 * issuer.issue_cpu_s, "hooks": None if cuda is None
                                  else 1e3 * cuda.hook_s},
            "host_cost": host_cost(issuer.cpu_s, accounting.energy_thread_cpu_s, None if cuda is None else cuda.hook_s,
                                   issuer.steps, issuer.step_interval_s(),
                                   self._thread_clock.sleeps + (0 if cuda is None else cuda.sleeps)),
            "requests": actuator.figures(),
            **accounting.figures(issuer.controlled_steps / issuer.steps if issuer.steps else 0.0),
            "predicted": {**{k: v for k, v in asdict(predicted).items() if k != "method"},
                          "range": predicted_range(plan.problem, plan.schedule).as_json()},
        }
