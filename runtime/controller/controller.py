"""The predictive clock controller's Python API: a context manager with ``.step()`` once per training step.

    from kdvfs.runtime.controller import Controller

    with Controller("plan.json", "step.trace.json", dry_run=True, log="kdvfs-run.jsonl") as controller:
        for batch in loader:
            train_step(batch)
            controller.step()
    print(controller.summary)

On entry it opens and checks the GPU (:mod:`~kdvfs.runtime.controller.control.opening`), takes its lease and
starts its watchdog unless ``dry_run``, and starts the background thread (:mod:`~kdvfs.runtime.controller.
control.issuer`). ``step()`` records a CUDA event (no GPU sync). On exit, an exception, SIGINT or SIGTERM it
stops the thread, returns the clocks, stops the watchdog and builds :attr:`summary` (a SIGTERM meanwhile waits
for the end). A check that fails raises before any clock changed; see docs/design/controller.md.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from kdvfs.common.errors import KdvfsError
from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.control.assembly import ThreadBuilder, ThreadParts, shape_book
from kdvfs.runtime.controller.control.managed import Managed
from kdvfs.runtime.controller.control.opening import Opened, lease_and_watch, open_checked
from kdvfs.runtime.controller.control.summary import run_summary, window_records
from kdvfs.runtime.controller.event_log import EventLog
from kdvfs.runtime.controller.model.plan import Plan
from kdvfs.runtime.controller.model.run_summary import RunSummary
from kdvfs.runtime.controller.model.step_plan import StepPlan
from kdvfs.runtime.controller.shapes.book import ShapeBook
from kdvfs.runtime.controller.shapes.steps import VaryingSteps
from kdvfs.runtime.controller.timing.gpu_timeline import StepTimeline
from kdvfs.runtime.device.host_time import Clock, RealClock
from kdvfs.runtime.device.interface import Device
from kdvfs.runtime.device.watchdog import stop_watchdog
from kdvfs.runtime.job import JobGroup, Rank

if TYPE_CHECKING:
    from kdvfs.runtime.controller.shapes.varying import StepShapes

STOP_TIMEOUT_S = 5.0


class Controller(Managed):
    """See the module docstring. ``policy``, ``trace`` and ``options`` make a :class:`ControllerConfig`
    (:meth:`ControllerConfig.from_options`: its fields, and each group's by their flat names, e.g. ``window_s``,
    ``anchor_every``, ``online``); or pass ``config``.

    ``device``, ``timeline`` and ``clock`` replace the GPU (NVML), its CUDA-event timeline and the host clock;
    tests pass a :class:`~kdvfs.runtime.testing.fake_gpu.FakeGpu` with its timeline and virtual clock, explicitly.
    ``varying``: the captured shapes of a run whose steps vary, the step model's prediction and where each step's
    shape comes from (:class:`VaryingSteps`); with it every step is planned by its shape
    (:mod:`kdvfs.runtime.controller.shapes.steps`); without it the controller looks for them in the trace's
    captures when it opens, unless ``look_for_varying`` is False (a caller that looked already).
    """

    def __init__(self, policy: str | None = None, trace: str | None = None, *, config: ControllerConfig | None = None,
                 device: Device | None = None, timeline: StepTimeline | None = None, clock: Clock | None = None,
                 varying: VaryingSteps | None = None, look_for_varying: bool = True, **options: Any) -> None:
        if config is None:
            if policy is None or trace is None:
                raise TypeError("Controller needs a policy (or plan) and the expected trace, or a config")
            config = ControllerConfig.from_options(str(policy), str(trace), **options)
        self.config = config
        self.summary: RunSummary | None = None
        """The run's summary, once closed (``summary.to_json()``: its JSON form)."""
        self.rank = Rank.from_environment()
        self.book: ShapeBook | None = None
        """The plans of the shape buckets of a run whose steps vary (None for a run of one shape)."""
        self._given = (device, timeline, clock or RealClock())
        self._varying, self._look_for_varying = varying, look_for_varying
        self._step_shapes: StepShapes | None = None
        self._stack = contextlib.ExitStack()
        self._log = EventLog(None)
        self._opened: Opened | None = None
        self._parts: ThreadParts | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None

    @property
    def plan(self) -> Plan | None:
        """The plan or policy the controller runs (None before it opened)."""
        return None if self._opened is None else self._opened.plan

    @property
    def step_plan(self) -> StepPlan | None:
        """The step's clock changes on its expected timeline (None before the controller opened)."""
        return None if self._opened is None else self._opened.step_plan

    def _open(self) -> None:
        if self.config.own_process:
            raise KdvfsError("own_process: a Controller runs in the training process; use ProcessController(config) "
                             "(kdvfs.runtime.controller), as kdvfs run does")
        device, timeline, clock = self._given
        self.config = self.config.for_rank(self.rank)
        opened = self._opened = open_checked(self.config, self.rank, device, self._stack)
        self.config = config = opened.config
        if self._varying is None and self._look_for_varying:
            from kdvfs.runtime.controller.shapes.varying import varying_steps

            found = varying_steps(config.trace, clock)
            if found is not None:
                self._varying, self._step_shapes = found
        if self._varying is not None:
            self.book = shape_book(opened, self._varying, self._stack)
        self._exit_on_sigterm()
        self._watchdog = lease_and_watch(opened, self.rank, self._stack)
        if self._watchdog is not None:
            self._stack.callback(self._stop_watchdog)  # before the lease is released
        self._log = EventLog(config.log)
        self._stack.callback(self._log.close)
        job = None
        if self.rank.distributed:
            job = JobGroup(self.rank)
            self._stack.callback(job.close)  # after everything started later (the issuer uses it)
        self._log_start()
        self._start(ThreadBuilder(opened, clock, self._log, self.book, self._varying).build(timeline, job, self._stack))

    def _log_start(self) -> None:
        """The event log's ``start`` record."""
        opened, config = self._opened, self.config
        assert opened is not None
        problem, step_plan = opened.plan.problem, opened.step_plan
        self._log.write("start", clock="perf_counter", rank=self.rank.rank, gpu_index=opened.device.index,
                        pid=os.getpid(), source=opened.plan.source, gpu=problem.profile.name,
                        trace=problem.trace.meta.workload, dry_run=config.dry_run, latency_s=problem.latency_s,
                        expected_s=step_plan.expected_s, auto_s=step_plan.auto_s,
                        anchor_margin_s=config.timing.anchor_margin_s if config.timing.anchors else None,
                        changes=len(step_plan.kernels))

    def _start(self, parts: ThreadParts) -> None:
        """Start the thread, then the shape probe and the anchor hooks, each undone on close."""
        self._parts = parts
        parts.issuer.start()
        self._stack.callback(self._stop_thread)
        if self._step_shapes is not None:
            self._step_shapes.probe.install()
            self._stack.callback(self._step_shapes.probe.remove)
        if parts.hooks is not None:
            parts.hooks.install()
            self._stack.callback(parts.hooks.remove)

    def step(self) -> None:
        """Mark the end of a training step (call it once per optimizer step)."""
        if self._step_shapes is not None:
            self._step_shapes.mark_step()
        parts = self._parts
        if parts is not None and parts.issuer.is_alive() and parts.issuer.error is None:
            parts.issuer.queue.put(parts.timeline.mark())

    def flush(self) -> None:
        """Block until the background thread has handled every step marked so far."""
        if self._parts is not None and self._parts.issuer.is_alive():
            self._parts.issuer.queue.join()

    def _stop_thread(self) -> None:
        assert self._parts is not None and self._opened is not None
        issuer = self._parts.issuer
        try:
            issuer.stop_event.set()
            issuer.queue.put(None)
            issuer.join(STOP_TIMEOUT_S)
        finally:  # also when interrupted (Ctrl-C): no request of the thread's may follow the restore
            self._parts.actuator.close()
        restored = self._stop_watchdog()
        self._parts.accounting.close()
        self.summary = run_summary(self._opened, self._parts, self.rank, restored)
        self._log.write("summary", **self.summary.to_json())
        if not restored:
            print(f"kdvfs: {self.summary.restore_error}", file=sys.stderr)

    def _stop_watchdog(self) -> bool:
        """Stop the watchdog, which resets the clocks itself when the actuator's restore failed (idempotent);
        True when the GPU is back at its own control."""
        restored = self._parts is None or self._parts.actuator.restored
        return restored if self._watchdog is None else stop_watchdog(self._watchdog, restored)

    @property
    def windows(self) -> list[dict[str, Any]]:
        """The run's A/B windows (:class:`~kdvfs.runtime.controller.measurement.accounting.Window` fields and
        ``as_intended``)."""
        return window_records(None if self._parts is None else self._parts.accounting)

    def close(self) -> None:
        """Restore the clocks and stop everything (idempotent); what ``__exit__`` does.

        A failed restore (tried by the actuator, then by the watchdog) does not raise: it is one line on stderr
        naming the GPU and ``sudo kdvfs reset --gpu-index I``, and the summary's ``restore_error`` and
        ``gpu_restored``; everything else is still stopped and the summary still built.
        """
        self._hold_sigterm()
        atexit.unregister(self.close)
        self._stack.close()
