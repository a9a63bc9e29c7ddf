"""Options of the clock controller, shared by ``kdvfs run``, its child process and the Python API.

:class:`ControllerConfig` holds what the controller applies, to which GPU and where it reports; the options of
each concern are grouped in a frozen object of their own: :class:`MeasurementConfig` (A/B windows, the guard,
the energy counter), :class:`TimingConfig` (step matching, the anchors, request timing) and
:class:`OnlineConfig` (the online policy's decisions). :meth:`ControllerConfig.from_options` builds one from
the flat keyword arguments of :class:`~kdvfs.runtime.controller.controller.Controller` (``window_s=``,
``anchor_every=``, ``online=``, ...: :data:`FLAT_OPTIONS` says where each goes).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdvfs.common.errors import KdvfsError
from kdvfs.common.units import MS_PER_S, checked_budget, checked_latency_s
from kdvfs.runtime.job import Rank, rank_path

CPU_TEST_MATCH_TOLERANCE = 1.0
MAX_AB_SHARE = 0.9


@dataclass(frozen=True)
class MeasurementConfig:
    """How the controller measures its effect and guards the budget.

    Attributes:
        window_steps, window_s: A/B windows last at least this many steps and seconds.
        ab_share: share of windows run at auto, in [0, 0.9]; 0 turns the A/B measurement off.
        ab_seed: seed of the A/B order.
        energy_read_every_s: the energy counter is read on its own thread, just after its updates around each
            window edge and, with nothing asked, one update at least this often (s); 0: only at window edges, on
            the controller's thread: for counters that cost nothing, e.g. the fake GPU's
            (:mod:`kdvfs.runtime.device.energy_trace`).
        guard_margin: allowed beyond the budget: the guard backs off when the lower end of the measured
            slowdown's 95% interval exceeds budget + margin.
        guard_min_pairs: A/B pairs the guard needs before it may back off.
        guard_retry_s: how long a back-off lasts before control resumes with fresh evidence (doubled at each
            further back-off).
        energy: read the GPU's energy counter (False: time only, no joules; for GPUs without a counter).
    """

    window_steps: int = 10
    window_s: float = 0.5
    ab_share: float = 0.25
    ab_seed: int = 0
    energy_read_every_s: float = 5.0
    guard_margin: float = 0.005
    guard_min_pairs: int = 3
    guard_retry_s: float = 60.0
    energy: bool = True

    def __post_init__(self) -> None:
        if min(self.guard_min_pairs, self.window_steps) < 1:
            raise KdvfsError("confirm steps, guard pairs and window steps must be >= 1")
        if not 0 <= self.ab_share <= MAX_AB_SHARE:
            raise KdvfsError(f"--ab-share {self.ab_share} must be in [0, {MAX_AB_SHARE}] (the share of windows at "
                             "auto; 0 turns the measurement off)")
        if min(self.window_s, self.energy_read_every_s, self.guard_retry_s) < 0:
            raise KdvfsError("window seconds, energy read interval and guard retry must be >= 0")

    def check_window(self, latency_s: float) -> None:
        """Raise unless a window outlasts the switching latency (the change must settle within it)."""
        if self.window_s <= latency_s:
            raise KdvfsError(f"A/B window of {self.window_s * MS_PER_S:g} ms is not longer than the switching latency "
                             f"({latency_s * MS_PER_S:g} ms); use a longer window (--ab-window-s)")


@dataclass(frozen=True)
class TimingConfig:
    """How the controller follows the step and times its requests.

    Attributes:
        match_tolerance: largest relative difference between a step's GPU time and the expected one (in CPU
            test mode ``CPU_TEST_MATCH_TOLERANCE`` instead: :attr:`ControllerConfig.step_match_tolerance`).
        confirm_steps: consecutive matching steps before the controller acts (and to learn the step's
            allocation count).
        anchors: record CUDA events inside the step (top-level blocks' forward and backward, the optimizer
            step) and place requests on them (:mod:`kdvfs.runtime.controller.timing.anchors`); off: step
            boundaries only.
        anchor_every: anchors at every N-th top-level block only (the first, the N+1-th, ...; forward and
            backward; the optimizer step's always): fewer hooks on the training thread, whose CPU the anchors
            are, and coarser progress inside the step; 1: every block.
        anchor_margin_ms: an anchor is used for a request only if it is expected at least this long before the
            request's issue instant (the thread's wake-up after the GPU passed it must fit in between).
        issue_early_ms: requests go out this much earlier than one latency before their change, so that the
            thread's late wake-up from a timed sleep does not make them late.
    """

    match_tolerance: float = 0.1
    confirm_steps: int = 2
    anchors: bool = True
    anchor_every: int = 1
    anchor_margin_ms: float = 2.0
    issue_early_ms: float = 0.25

    def __post_init__(self) -> None:
        if min(self.anchor_margin_ms, self.issue_early_ms) < 0:
            raise KdvfsError(f"anchor margin {self.anchor_margin_ms} ms and issue-early {self.issue_early_ms} ms "
                             "must be >= 0")
        if not isinstance(self.anchor_every, int) or self.anchor_every < 1:
            raise KdvfsError(f"anchor_every {self.anchor_every} must be a whole number >= 1 (1: every block)")
        if not 0 < self.match_tolerance < 1:
            raise KdvfsError(f"match tolerance {self.match_tolerance} must be in (0, 1)")
        if self.confirm_steps < 1:
            raise KdvfsError("confirm steps, guard pairs and window steps must be >= 1")

    @property
    def anchor_margin_s(self) -> float:
        """The anchor margin (s); infinite without anchors (no request is placed on one)."""
        return self.anchor_margin_ms / MS_PER_S if self.anchors else float("inf")

    @property
    def issue_early_s(self) -> float:
        """How much earlier than one latency before their change requests go out (s)."""
        return self.issue_early_ms / MS_PER_S


@dataclass(frozen=True)
class OnlineConfig:
    """How a frozen policy decides online (plans are always replayed).

    Attributes:
        enabled: a frozen policy decides online inside every controlled step, on live measurements
            (:mod:`kdvfs.runtime.controller.decisions.online`); False (``--replay``): its noise-free rollout
            over the trace is replayed as a fixed schedule.
        interval_ms: time between the online policy's decision points while its standing order depends on the
            budget spent (the environment's decision interval when longer); otherwise it decides only where
            something can change.
        warm_up: a rehearsal right before each decision point the thread slept to (the live state then and a
            throwaway decision at it), so that the decision runs on a warm core
            (:mod:`kdvfs.runtime.controller.decisions.warm_up`).
        sleep_lead_in: between two controlled steps the controller's thread sleeps through the next step's
            lead-in (to where its first anchor is expected at the step's pace) before its bookkeeping and
            first decision (:mod:`kdvfs.runtime.controller.control.issuer`), so that it does not hold the
            interpreter lock while the training thread launches the step's first block.
    """

    enabled: bool = True
    interval_ms: float = 0.25
    warm_up: bool = True
    sleep_lead_in: bool = True

    def __post_init__(self) -> None:
        if self.interval_ms <= 0:
            raise KdvfsError(f"online decision interval {self.interval_ms} ms must be > 0")

    @property
    def interval_s(self) -> float:
        """The time between decision points while the standing order depends on the budget spent (s)."""
        return self.interval_ms / MS_PER_S


GROUPS: dict[str, type[Any]] = {"measurement": MeasurementConfig, "timing": TimingConfig, "online": OnlineConfig}
"""The grouped fields of :class:`ControllerConfig` and their types."""

FLAT_OPTIONS: dict[str, tuple[str, str]] = {
    **{name: ("measurement", name) for name in (
        "window_steps", "window_s", "ab_share", "ab_seed", "energy_read_every_s", "guard_margin", "guard_min_pairs",
        "guard_retry_s")},
    "measure_energy": ("measurement", "energy"),
    **{name: ("timing", name) for name in (
        "match_tolerance", "confirm_steps", "anchors", "anchor_every", "anchor_margin_ms", "issue_early_ms")},
    "online": ("online", "enabled"), "online_interval_ms": ("online", "interval_ms"),
    "online_warm_up": ("online", "warm_up"), "sleep_lead_in": ("online", "sleep_lead_in"),
}
"""Each flat option of :meth:`ControllerConfig.from_options` (the ``Controller``'s keyword arguments): its group
and its field there."""


@dataclass(frozen=True)
class ControllerConfig:
    """What the controller applies and how.

    Attributes:
        policy: the schedule source: a plan from ``kdvfs plan -o plan.json`` or a frozen policy
            (``.kdvfs-policy.npz``).
        trace: the expected training step (a kdvfs trace file or bundled name, e.g. from ``kdvfs capture``).
        gpu: GPU profile name or ``.yaml`` (default: the plan's, or the shipped profile whose ``nvml_names``
            list the GPU).
        budget: allowed step-time increase over auto (0.01 = 1%): the policy's budget and the guard's.
        dry_run: do everything except changing clocks; log what would have been requested.
        gpu_index: NVML index of the GPU the script trains on (None: CUDA device ``LOCAL_RANK``, 0 outside
            torchrun, through ``CUDA_VISIBLE_DEVICES``: :func:`kdvfs.runtime.device.visible.rank_gpu_index`).
        nvml_module: the NVML binding to import (``pynvml``; tests name a fake).
        daemon: the socket of the ``kdvfs daemon`` to lock clocks through (None: ``KDVFS_DAEMON`` when set, else
            NVML directly, which needs root); readings stay on NVML (:mod:`kdvfs.runtime.daemon.client`).
        latency_ms: switching latency to issue requests ahead by (default: the profile's).
        log: JSONL file of every request, step and measurement window (default: none).
        tensorboard: folder for TensorBoard scalars (default: none).
        watchdog: spawn the watchdog process (only ever when clocks are changed, never in a dry run).
        cpu_test_mode: accept a CPU-only script; host time stands in for the GPU timeline (tests).
        own_process: run the controller in a process of its own; the training process keeps the step marks, the
            hooks and a thread answering it (:mod:`kdvfs.runtime.controller.training.own_process`; ``kdvfs run``'s
            default, under torchrun too: one a rank; False here, for the API's ``Controller``, which runs in the
            training process).
        report_path: where the child process of ``kdvfs run`` writes its summary.
        measurement: A/B windows, guard and energy counter (:class:`MeasurementConfig`).
        timing: step matching, anchors and request timing (:class:`TimingConfig`).
        online: the online policy's decisions (:class:`OnlineConfig`).
    """

    policy: str
    trace: str
    gpu: str | None = None
    budget: float = 0.01
    dry_run: bool = False
    gpu_index: int | None = None
    nvml_module: str = "pynvml"
    daemon: str | None = None
    latency_ms: float | None = None
    log: str | None = None
    tensorboard: str | None = None
    watchdog: bool = True
    cpu_test_mode: bool = False
    own_process: bool = False
    report_path: str | None = None
    measurement: MeasurementConfig = field(default_factory=MeasurementConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    online: OnlineConfig = field(default_factory=OnlineConfig)

    @classmethod
    def from_options(cls, policy: str, trace: str, **options: Any) -> ControllerConfig:
        """A config from flat keyword options: this class's own fields and every option of
        :data:`FLAT_OPTIONS` (e.g. ``window_s=0.1``, ``anchor_every=2``, ``online=False``), which go to their
        group. Raises TypeError for an unknown option, as a constructor does."""
        grouped: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
        top: dict[str, Any] = {}
        for name, value in options.items():
            if name in FLAT_OPTIONS:
                group, member = FLAT_OPTIONS[name]
                grouped[group][member] = value
            elif name in {f.name for f in dataclasses.fields(cls)} - set(GROUPS):
                top[name] = value
            else:
                raise TypeError(f"ControllerConfig got an unexpected option {name!r}")
        return cls(policy=policy, trace=trace, **top,
                   **{group: kind(**grouped[group]) for group, kind in GROUPS.items()})

    @property
    def step_match_tolerance(self) -> float:
        """The tolerance step matching uses: ``timing.match_tolerance``, or in CPU test mode
        ``CPU_TEST_MATCH_TOLERANCE``. There a step's time is the training thread's CPU time on a shared host,
        which moves by far more than the GPU's between a capture and a run: the mode tests the pipeline, not
        the matching."""
        return CPU_TEST_MATCH_TOLERANCE if self.cpu_test_mode else self.timing.match_tolerance

    def __post_init__(self) -> None:
        checked_budget(self.budget)
        if self.latency_ms is not None:
            checked_latency_s(self.latency_ms)

    @property
    def latency_s(self) -> float | None:
        """The switching latency to issue requests ahead by (s; None: the profile's)."""
        return None if self.latency_ms is None else checked_latency_s(self.latency_ms)

    def guard_off(self) -> str | None:
        """Why the performance guard must not act in this run (its evidence is noise), or None."""
        if self.cpu_test_mode:
            return ("CPU test mode: step times are CPU times, which no clock changes, so a measured slowdown is "
                    "noise; the guard does not back off on it")
        return None

    def not_measured_on_a_gpu(self, fake_nvml: bool) -> str | None:
        """Why this run's measured figures (joules, saving, slowdown) are no GPU's measurement, or None;
        ``fake_nvml``: the NVML binding is a fake (``kdvfs.runtime.testing.nvml``)."""
        if self.cpu_test_mode and fake_nvml:
            return ("CPU test mode on a fake NVML: step times are CPU times and joules the fake's, so the energy, "
                    "saving and slowdown figures mean nothing")
        if self.cpu_test_mode:
            return ("CPU test mode: step times are CPU times, which no clock changes, so the saving and slowdown "
                    "figures mean nothing")
        if fake_nvml:
            return "a fake NVML: joules are the fake's, not a GPU's, so the energy and saving figures mean nothing"
        return None

    def for_rank(self, rank: Rank) -> ControllerConfig:
        """This config for rank ``rank.rank`` of a torchrun job: its own trace and plan or policy where they
        exist (``step.rank1.trace.json``, ``plan.rank1.json``: :func:`kdvfs.runtime.job.rank_path`), else the
        shared ones; its own log and TensorBoard folder. Unchanged outside torchrun."""
        if not rank.distributed:
            return self

        def own(path: str | None, exists: bool = True) -> str | None:
            ranked = None if path is None else rank_path(path, rank.rank)
            return str(ranked) if ranked is not None and (not exists or ranked.exists()) else path

        return dataclasses.replace(self, trace=str(own(self.trace)), policy=str(own(self.policy)),
                                   log=own(self.log, exists=False), tensorboard=own(self.tensorboard, exists=False))

    def save(self, path: Path) -> None:
        """Write the config as JSON (for the child process): its fields, each group as an object."""
        Path(path).write_text(json.dumps(dataclasses.asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> ControllerConfig:
        """Read a config written by :meth:`save` (by the same version of kdvfs)."""
        document = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(**{name: GROUPS[name](**value) if name in GROUPS else value for name, value in document.items()})
