"""The predictive clock controller's Python API: a context manager with ``.step()`` once per training step.

    from kdvfs.runtime.controller import Controller

    with Controller("plan.json", "step.trace.json", dry_run=True, log="kdvfs-run.jsonl") as controller:
        for batch in loader:
            train_step(batch)
            controller.step()
    print(controller.summary)

On entry it opens the GPU (NVML, or the device it is given), computes the step's schedule once from the
source (:mod:`kdvfs.runtime.controller.source`), checks that the profile is this GPU's, that every clock of the
schedule is supported and, unless ``dry_run``, that this process may lock clocks; then it starts the
watchdog process (not in a dry run) and its background thread (:mod:`kdvfs.runtime.controller.issuer`).
Under torchrun each rank's controller opens its own GPU (CUDA device ``LOCAL_RANK``), its own trace and
plan where they exist (:meth:`ControllerConfig.for_rank`) and its own watchdog, and joins the job's gloo
group (:class:`kdvfs.runtime.job.JobGroup`) through which the steps are reduced for the accounting and guard. A check
that fails raises before any clock changed. ``step()`` records a CUDA event and reads the caching
allocator's counter (a few microseconds, no GPU sync); with ``anchors`` (the default) hooks record CUDA events
inside the step too (:mod:`kdvfs.runtime.controller.anchors`), on which the thread places the step's requests. On
exit, on an exception, on SIGINT (as
KeyboardInterrupt) and SIGTERM (as SystemExit) it stops the thread, returns the clocks to the GPU, stops
the watchdog and builds :attr:`summary`.
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
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kdvfs.agents.common.problem import score
from kdvfs.runtime.controller.accounting import Accounting
from kdvfs.runtime.controller.actuator import Actuator, EventLog, parse_clocks
from kdvfs.runtime.controller.anchor_structure import TraceStructure
from kdvfs.runtime.controller.anchoring import Anchoring
from kdvfs.runtime.controller.anchors import AnchorHooks
from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.gpu_timeline import CudaStepTimeline, HostStepTimeline, StepTimeline
from kdvfs.runtime.controller.issuer import Issuer
from kdvfs.runtime.controller.matching import Guard, StepMatcher
from kdvfs.runtime.controller.source import Plan, is_policy_file, load_plan
from kdvfs.runtime.controller.timeline import StepPlan
from kdvfs.runtime.device.host_time import Clock, RealClock
from kdvfs.runtime.device.interface import Device, check_clocks_mhz
from kdvfs.runtime.device.nvml import NvmlDevice, import_nvml, require_clock_permission, terminate_on_sigterm
from kdvfs.runtime.device.visible import rank_gpu_index
from kdvfs.runtime.device.watchdog import spawn_watchdog, stop_watchdog
from kdvfs.runtime.job import JobGroup, Rank

if TYPE_CHECKING:
    from kdvfs.runtime.controller.decider import DeciderProcess
    from kdvfs.runtime.controller.online import OnlineSteps

STOP_TIMEOUT_S = 5.0
RUN_NEEDS = "the clock controller locks GPU clocks"
RUN_FIX = "run it as root, or add --dry-run to see what it would do without changing clocks"


@contextlib.contextmanager
def switch_interval(interval_ms: float) -> Iterator[None]:
    """The interpreter's switch interval (``sys.setswitchinterval``) set to ``interval_ms`` inside (0: left as it
    is), and put back on exit unless something else changed it meanwhile. A thread that wants the interpreter
    lock from one that does not let go of it waits this long before the holder is asked to drop it; shorter
    intervals switch the process's other waiting threads sooner too. Measured once on an H200 host, at 1 ms
    (``docs/controller.md``): not shown to change the HF Trainer overhead or to bring the decisions' p99
    within 500 us."""
    if interval_ms <= 0:
        yield
        return
    before_s = sys.getswitchinterval()
    sys.setswitchinterval(interval_ms / 1e3)
    ours_s = sys.getswitchinterval()
    try:
        yield
    finally:
        if sys.getswitchinterval() == ours_s:
            sys.setswitchinterval(before_s)


def check_device(plan: Plan, device: Device) -> None:
    """Raise unless ``device`` supports each clock of ``plan``'s schedule (and of its online policy's grid)."""
    supported = device.supported_clocks_mhz()
    labels = {plan.problem.costs.label(int(a)) for a in plan.schedule.actions}
    for label in sorted(labels | set(plan.online.labels if plan.online is not None else ())):
        core_mhz, mem_mhz = parse_clocks(label)
        check_clocks_mhz(supported, core_mhz, mem_mhz, f"GPU {device.index} ({device.name})")


class Controller:
    """See the module docstring. ``policy`` and ``trace`` and ``options`` make a :class:`ControllerConfig`.

    ``device``, ``timeline`` and ``clock`` replace the GPU (NVML), its CUDA-event timeline and the host clock;
    tests pass a :class:`~kdvfs.runtime.testing.fake_gpu.FakeGpu` with its timeline and virtual clock, explicitly.
    """

    def __init__(self, policy: str | None = None, trace: str | None = None, *, config: ControllerConfig | None = None,
                 device: Device | None = None, timeline: StepTimeline | None = None, clock: Clock | None = None,
                 **options: Any) -> None:
        if config is None:
            if policy is None or trace is None:
                raise TypeError("Controller needs a policy (or plan) and the expected trace, or a config")
            config = ControllerConfig(policy=str(policy), trace=str(trace), **options)
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
        self._decider: DeciderProcess | None = None
        self._online: OnlineSteps | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._log = EventLog(None)
        self.rank = Rank.from_environment()
        self._job: JobGroup | None = None
        self._gpu_index: int | None = None

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
        """The GPU: the device given, or NVML's GPU ``gpu_index`` (default: this rank's, CUDA device
        ``LOCAL_RANK``)."""
        if self._device is not None:
            return self._device
        nvml = import_nvml(self.config.nvml_module)
        index = rank_gpu_index(nvml) if self.config.gpu_index is None else self.config.gpu_index
        self.config = replace(self.config, gpu_index=index)
        return self._stack.enter_context(NvmlDevice(index, nvml))

    def _open(self) -> None:
        self.config = self.config.for_rank(self.rank)
        self._decider = self._start_decider()
        device = self._open_device()
        self._gpu_index = device.index
        config = self.config
        self.plan = load_plan(config, device.name)
        check_device(self.plan, device)
        if not config.dry_run:
            require_clock_permission(needs=RUN_NEEDS, fix=RUN_FIX, allowed=device.has_clock_permission())
        problem = self.plan.problem
        config.check_window(problem.latency_s)
        self.step_plan = StepPlan.build(problem, self.plan.schedule, config.dry_run)
        if threading.current_thread() is threading.main_thread():
            self._stack.enter_context(terminate_on_sigterm())
        self._stack.enter_context(switch_interval(config.switch_interval_ms))
        if not config.dry_run and config.watchdog and isinstance(device, NvmlDevice):
            self._watchdog = spawn_watchdog(device.index, config.nvml_module)
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
                        anchor_margin_s=config.anchor_margin_ms / 1e3 if config.anchors else None,
                        changes=len(self.step_plan.kernels))
        self._start_thread(device)

    def _start_thread(self, device: Device) -> None:
        config, plan, clock = self.config, self.step_plan, self._clock
        assert plan is not None and self.plan is not None
        self._actuator = Actuator(device, config.dry_run, self.plan.problem.profile.clocks.default_memory_mhz,
                                  self._log, clock)
        self._stack.callback(self._actuator.close)
        latency_s = self.plan.problem.latency_s
        settle_steps = 1 + int(latency_s // plan.auto_s)
        self._accounting = Accounting(device, clock, config, settle_steps, self._log, self._next_request_s)
        timeline = self._timeline or (HostStepTimeline(clock) if config.cpu_test_mode else CudaStepTimeline(clock))
        hooks = (AnchorHooks(timeline.anchor, config.anchor_every)
                 if config.anchors and isinstance(timeline, CudaStepTimeline) else None)
        structure = None if hooks is None else TraceStructure(self.plan.problem.trace, hooks.every,
                                                               lambda: hooks.blocks).kernels
        anchoring = Anchoring(plan, timeline, clock, latency_s, config.anchor_margin_ms / 1e3 if config.anchors
                              else float("inf"), config.step_match_tolerance, learn_auto=config.dry_run,
                              pace_from_auto=self.plan.online is not None and not config.dry_run, structure=structure)
        self._online = None if self.plan.online is None else self._online_steps(device, timeline, anchoring)
        self._issuer = Issuer(plan, latency_s, timeline,
                              StepMatcher(plan.auto_s, config.step_match_tolerance, config.confirm_steps),
                              Guard(config.budget, config.guard_margin, config.guard_min_pairs, config.guard_retry_s),
                              self._actuator, self._accounting, clock, self._log, anchoring,
                              config.issue_early_ms / 1e3, self._job, self._online, config.sleep_lead_in)
        self._timeline = timeline
        self._issuer.start()
        self._stack.callback(self._stop_thread)
        if hooks is not None:
            self._hooks = hooks
            self._hooks.install()
            self._stack.callback(self._hooks.remove)

    def _online_steps(self, device: Device, timeline: StepTimeline, anchoring: Anchoring) -> OnlineSteps:
        """The online policy's decisions inside each controlled step (:mod:`kdvfs.runtime.controller.online`)."""
        from kdvfs.runtime.controller.live_clocks import LiveClocks
        from kdvfs.runtime.controller.online import OnlineSteps
        from kdvfs.runtime.controller.warm_up import WarmUp

        assert self.plan is not None and self.plan.online is not None and self._actuator is not None
        config, problem, online = self.config, self.plan.problem, self.plan.online
        clocks = LiveClocks(online, self._actuator, device, problem.latency_s, online.latency_std_s, config.dry_run)
        interval_s = max(online.decision_interval_s, config.online_interval_ms / 1e3)
        if self._decider is None:
            online.prepare()
        else:
            self._decider.load(online.policy, problem)
        warm_up = WarmUp() if config.online_warm_up and self._decider is None else None
        return OnlineSteps(online, clocks, timeline, anchoring.map, anchoring.pace, self._clock, self._log,
                           problem.budget, config.budget, config.dry_run, interval_s, config.issue_early_ms / 1e3,
                           self._decider, config.online_lookahead, warm_up)

    def _start_decider(self) -> DeciderProcess | None:
        """The online policy's child process (``online_process``), started first: it imports its modules
        while the plan is built; None for a plan or ``--replay``."""
        if not (self.config.online and self.config.online_process and is_policy_file(Path(self.config.policy))):
            return None
        from kdvfs.runtime.controller.decider import DeciderProcess

        decider = DeciderProcess(self.config.decider_warm_ms / 1e3)
        self._stack.callback(decider.close)
        return decider

    def _next_request_s(self) -> float:
        return math.inf if self._issuer is None else self._issuer.next_request_s

    def step(self) -> None:
        """Mark the end of a training step (call it once per optimizer step)."""
        issuer = self._issuer
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
        """The run's A/B windows (:class:`~kdvfs.runtime.controller.accounting.Window` fields, ``as_intended``)."""
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

    def _summary(self) -> dict[str, Any]:
        issuer, actuator, accounting, plan = self._issuer, self._actuator, self._accounting, self.plan
        assert issuer is not None and actuator is not None and accounting is not None and plan is not None
        predicted = score(plan.problem, plan.schedule)
        guard = issuer.guard.slowdown()
        return {
            "rank": self.rank.rank, "world_size": self.rank.world_size, "gpu_index": self._gpu_index,
            "source": plan.source, "gpu": plan.problem.profile.name, "trace": plan.problem.trace.meta.workload,
            "dry_run": self.config.dry_run, "steps": issuer.steps, "controlled_steps": issuer.controlled_steps,
            "switches": actuator.switches, "mismatches": issuer.matcher.mismatches,
            "backed_off": issuer.guard.backoffs > 0, "backoff_reason": issuer.guard.reason,
            "guard_backoffs": issuer.guard.backoffs, "guard_slowdown_pct": None if guard is None else guard.mean_pct,
            "error": None if issuer.error is None else str(issuer.error),
            "restore_error": None if actuator.restore_error is None else str(actuator.restore_error),
            "anchors": {**issuer.anchoring.figures(), "blocks": None if self._hooks is None else self._hooks.blocks},
            "online_decisions": None if self._online is None else self._online.decisions,
            "online": None if self._online is None else self._online.figures(),
            "lead_in": issuer.lead_in_figures(),
            "controller_cpu_ms": {"thread": 1e3 * issuer.cpu_s, "thread_end_wait": 1e3 * issuer.end_wait_cpu_s,
                                  "thread_issue": 1e3 * issuer.issue_cpu_s, "hooks": 1e3 * self._timeline.hook_s
                                  if isinstance(self._timeline, CudaStepTimeline) else None},
            **accounting.figures(issuer.controlled_steps / issuer.steps if issuer.steps else 0.0),
            "predicted": {k: v for k, v in asdict(predicted).items() if k != "method"},
        }
