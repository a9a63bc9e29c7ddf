"""Options of the clock controller, shared by ``kdvfs run``, its child process and the Python API."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from kdvfs.envs.common.errors import KdvfsError
from kdvfs.runtime.job import Rank, rank_path

CPU_TEST_MATCH_TOLERANCE = 1.0
MAX_AB_SHARE = 0.9


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
        latency_ms: switching latency to issue requests ahead by (default: the profile's).
        log: JSONL file of every request, step and measurement window (default: none).
        tensorboard: folder for TensorBoard scalars (default: none).
        match_tolerance: largest relative difference between a step's GPU time and the expected one (in CPU
            test mode ``CPU_TEST_MATCH_TOLERANCE`` instead: see :attr:`step_match_tolerance`).
        confirm_steps: consecutive matching steps before the controller acts (and to learn the step's
            allocation count).
        guard_margin: allowed beyond the budget: the guard backs off when the lower end of the measured
            slowdown's 95% interval exceeds budget + margin.
        guard_min_pairs: A/B pairs the guard needs before it may back off.
        guard_retry_s: how long a back-off lasts before control resumes with fresh evidence (doubled at each
            further back-off).
        window_steps, window_s: A/B windows last at least this many steps and seconds.
        ab_share: share of windows run at auto, in [0, 0.9]; 0 turns the A/B measurement off.
        ab_seed: seed of the A/B order.
        energy_poll_s: how often the energy counter is read, on its own thread (0: only at window edges, on
            the controller's thread: for counters that cost nothing, e.g. the fake GPU's).
        anchors: record CUDA events inside the step (top-level blocks' forward and backward, the optimizer
            step) and place requests on them (:mod:`kdvfs.runtime.controller.anchoring`); off: step boundaries only.
        anchor_every: anchors at every N-th top-level block only (the first, the N+1-th, ...; forward and
            backward; the optimizer step's always): fewer hooks on the training thread, whose CPU the anchors
            are (0.8-1.0 ms per ~68 ms HF Trainer GPT-2 step on an H200 host at 1, against 0.13-0.14 ms
            without anchors: ``benchmarks/results/controller_online_hf_anchors_h200.md``), and coarser progress
            inside the step; 1: every block.
        anchor_margin_ms: an anchor is used for a request only if it is expected at least this long before the
            request's issue instant (the thread's wake-up after the GPU passed it must fit in between).
        issue_early_ms: requests go out this much earlier than one latency before their change, so that the
            thread's late wake-up from a timed sleep (0.09-0.14 ms on the H200) does not make them late.
        online: a frozen policy decides online inside every controlled step, on live measurements
            (:mod:`kdvfs.runtime.controller.online`); False (``--replay``): its noise-free rollout over the
            trace is replayed as a fixed schedule. Plans are always replayed.
        online_interval_ms: time between the online policy's decision points while its standing order
            depends on the budget spent (the environment's decision interval when longer); otherwise it
            decides only where something can change (:mod:`kdvfs.runtime.controller.online`).
        online_lookahead: after each evaluation the online policy is run ahead over this many of its next
            evaluations on the model's expected timeline, and its order holds until the first at which it would
            change (0: it runs at every evaluation, as in training; :mod:`kdvfs.runtime.controller.online`).
        online_process: the online policy decides in a child process
            (:mod:`kdvfs.runtime.controller.decider`), off the training process's interpreter lock; False (the
            default): on the controller's thread, where a decision is a few dozen microseconds of compiled code
            holding the lock, less than the child's round trip (``docs/controller.md``, "Online decisions").
        decider_warm_ms: with ``online_process``, the child wakes this long before the controller's next
            decision point is due, runs a throwaway decision and polls until the request comes (a core that
            slept runs the decision ~4x slower: :mod:`kdvfs.runtime.controller.decider`); 0: it sleeps until
            each request.
        online_warm_up: with online decisions on the controller's thread, a rehearsal right before each
            decision point the thread slept to (the live state then and a throwaway decision at it), so that the
            decision runs on a warm core (:mod:`kdvfs.runtime.controller.warm_up`; on the H200 it took the
            decisions' median from 63 to 30 us on GPT-3 XL and from 70 to 34 us on the HF Trainer, for 1.4-1.7 ms
            more of the thread's CPU a step, with no overhead difference shown: ``docs/controller.md``, "The
            warm-up rehearses the decision point").
        sleep_lead_in: with online decisions, between two controlled steps the controller's thread sleeps
            through the next step's lead-in (to where its first anchor is expected at the step's pace) before
            its bookkeeping and first decision (:mod:`kdvfs.runtime.controller.issuer`). On by default since
            2026-12-03: as an arm of one H200 HF Trainer GPT-2 b32 dry-run process it cost 0.60 [0.04, 1.16]
            and 0.82 [0.31, 1.34] points less overhead than without (4 and 8 pairs; separate runs, which differ
            by more, had shown no difference: ``docs/controller.md``, "Sleeping through the lead-in").
        switch_interval_ms: the interpreter's switch interval while the controller runs (0: left as it is,
            5 ms by default); it bounds how long the controller's thread waits for the interpreter lock after
            a wake or a decision when the training thread does not let go of it
            (:func:`kdvfs.runtime.controller.controller.switch_interval`).
        watchdog: spawn the watchdog process (only ever when clocks are changed, never in a dry run).
        cpu_test_mode: accept a CPU-only script; host time stands in for the GPU timeline (tests).
        report_path: where the child process of ``kdvfs run`` writes its summary.
    """

    policy: str
    trace: str
    gpu: str | None = None
    budget: float = 0.01
    dry_run: bool = False
    gpu_index: int | None = None
    nvml_module: str = "pynvml"
    latency_ms: float | None = None
    log: str | None = None
    tensorboard: str | None = None
    match_tolerance: float = 0.1
    confirm_steps: int = 2
    guard_margin: float = 0.005
    guard_min_pairs: int = 3
    guard_retry_s: float = 60.0
    window_steps: int = 10
    window_s: float = 0.5
    ab_share: float = 0.25
    ab_seed: int = 0
    energy_poll_s: float = 0.02
    anchors: bool = True
    anchor_every: int = 1
    anchor_margin_ms: float = 2.0
    issue_early_ms: float = 0.25
    online: bool = True
    online_interval_ms: float = 0.25
    online_lookahead: int = 0
    online_process: bool = False
    decider_warm_ms: float = 0.5
    online_warm_up: bool = True
    sleep_lead_in: bool = True
    switch_interval_ms: float = 0.0
    watchdog: bool = True
    cpu_test_mode: bool = False
    report_path: str | None = None

    @property
    def step_match_tolerance(self) -> float:
        """The tolerance step matching uses. In CPU test mode a step's time is the training thread's CPU time on
        a shared host, which moves by more than 10% between a capture and a later run under other load (seen:
        7-25 of 400 tiny-GPT steps matched on a loaded 2-core machine), and is bimodal: in one run on a 2-core
        machine, tiny-GPT steps took 3.5-4 ms or 5-5.5 ms of CPU, in stretches, against 3.46 ms captured, so
        at a tolerance of 0.5 the run matched 181 of 400 steps. Matching there is loose (at most twice the
        captured time): the mode tests the pipeline, not the matching."""
        return CPU_TEST_MATCH_TOLERANCE if self.cpu_test_mode else self.match_tolerance

    def __post_init__(self) -> None:
        if self.budget < 0:
            raise KdvfsError(f"--budget {self.budget} must be >= 0 (a fraction: 0.01 = 1%)")
        if self.latency_ms is not None and self.latency_ms < 0:
            raise KdvfsError(f"--latency-ms {self.latency_ms} must be >= 0")
        if min(self.anchor_margin_ms, self.issue_early_ms, self.decider_warm_ms) < 0:
            raise KdvfsError(f"anchor margin {self.anchor_margin_ms} ms, issue-early {self.issue_early_ms} ms and "
                             f"decider warm lead {self.decider_warm_ms} ms must be >= 0")
        if self.switch_interval_ms < 0:
            raise KdvfsError(f"switch interval {self.switch_interval_ms} ms must be >= 0 (0: the interpreter's)")
        if not isinstance(self.anchor_every, int) or self.anchor_every < 1:
            raise KdvfsError(f"anchor_every {self.anchor_every} must be a whole number >= 1 (1: every block)")
        if not isinstance(self.online_lookahead, int) or self.online_lookahead < 0:
            raise KdvfsError(f"online lookahead {self.online_lookahead} must be >= 0 (evaluations; 0: none)")
        if self.online_interval_ms <= 0:
            raise KdvfsError(f"online decision interval {self.online_interval_ms} ms must be > 0")
        if not 0 < self.match_tolerance < 1:
            raise KdvfsError(f"match tolerance {self.match_tolerance} must be in (0, 1)")
        if min(self.confirm_steps, self.guard_min_pairs, self.window_steps) < 1:
            raise KdvfsError("confirm steps, guard pairs and window steps must be >= 1")
        if not 0 <= self.ab_share <= MAX_AB_SHARE:
            raise KdvfsError(f"--ab-share {self.ab_share} must be in [0, {MAX_AB_SHARE}] (the share of windows at "
                             "auto; 0 turns the measurement off)")
        if min(self.window_s, self.energy_poll_s, self.guard_retry_s) < 0:
            raise KdvfsError("window seconds, energy poll interval and guard retry must be >= 0")

    def check_window(self, latency_s: float) -> None:
        """Raise unless a window outlasts the switching latency (the change must settle within it)."""
        if self.window_s <= latency_s:
            raise KdvfsError(f"A/B window of {self.window_s * 1e3:g} ms is not longer than the switching latency "
                             f"({latency_s * 1e3:g} ms); use a longer window (--ab-window-s)")

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
        """Write the config as JSON (for the child process)."""
        Path(path).write_text(json.dumps(dataclasses.asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> ControllerConfig:
        """Read a config written by :meth:`save`."""
        return cls(**json.loads(Path(path).read_text(encoding="utf-8")))
