"""Online decisions: a frozen policy choosing the clocks inside every controlled step, on live measurements.

:class:`OnlineSteps` is the step source of a frozen policy (not ``--replay``): through each controlled step it
wakes where something can change (``policy``, ``change``, ``arrival``, ``issue``, ``proposal``; counted in the
summary's ``wakes``), builds the policy's observation from what it measures
(:class:`~kdvfs.envs.env.observing.live.LiveState`) and requests the pair the policy names, one latency (plus
``issue_early_ms``) before the kernel it is for, placed from the latest anchor (held until then when that is
more than ``HOLD_MIN_S`` away). Times are host seconds; the budget is a fraction; the run's budget is fed back
from the measured slowdown (:mod:`~kdvfs.runtime.controller.measurement.budget_feedback`); a dry run keeps it.

Invariants: at most one change pending or held at a time; no request lands after the step's last kernel
started; a step's first pair is requested during the previous step (at once in the first controlled step).
The wake reasons, progress, clocks in effect, budget and decision timing in full: docs/design/controller.md.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from kdvfs.agents.learned.policy.live_decision import NO_REQUEST
from kdvfs.agents.learned.policy.online import OnlineDecision
from kdvfs.envs.env.observing.live import LiveState
from kdvfs.runtime.controller.decisions.decision_records import RecentDurations, quantiles
from kdvfs.runtime.controller.decisions.live_clocks import LiveClocks
from kdvfs.runtime.controller.decisions.look_ahead import prepare_states_ahead, states_ahead
from kdvfs.runtime.controller.decisions.online_step import OnlineStep
from kdvfs.runtime.controller.decisions.sources import ThreadContext
from kdvfs.runtime.controller.decisions.warm_up import WarmUp
from kdvfs.runtime.controller.measurement.budget_feedback import fed_back_budget
from kdvfs.runtime.controller.measurement.estimator import Interval
from kdvfs.runtime.controller.model.run_summary import OnlineFigures
from kdvfs.runtime.controller.timing.gpu_timeline import StepEnd
from kdvfs.runtime.controller.timing.step_times import PassedAnchor

MIN_GAP_S = 20e-6
"""Least time between decision points (s): a thread late for a change does not spin."""
HOLD_MIN_S = 0.5e-3
"""A decided change whose request would go out less than this after the decision (host s) goes out at once."""
MAX_AHEAD = 512
"""Most decision intervals a budget-dependent order's proposals are read ahead at once (one more decision
point then reads further)."""
BUDGET_DECISIONS = 256
"""Decision points whose durations set the time a step's hand-over decision is made ahead of it."""


class HeldChange(NamedTuple):
    """A decided change whose request goes out one latency before its kernel (docs/design/controller.md)."""

    pair: int
    step: int
    kernel: int


@dataclass(frozen=True)
class OnlineSettings:
    """How the online policy runs through the steps.

    Attributes:
        budget: the step's budget (fraction of auto's step time; a torchrun rank's includes its slack), which
            the feedback moves.
        job_budget: the run's (the job's) budget, to which the measured slowdown is held.
        dry_run: no clock changes: no feedback, and kernel times are auto's.
        interval_s: time between decision points where a standing order's proposal depends on the budget
            (host s).
        early_s: requests go out this much earlier than a latency ahead (s; the thread wakes late).
        warm_up: rehearse each decision right before each decision point the thread slept to
            (:mod:`kdvfs.runtime.controller.decisions.warm_up`).
        sleep_lead_in: the issuer sleeps through each controlled step's lead-in
            (:mod:`kdvfs.runtime.controller.control.issuer`).
    """

    budget: float
    job_budget: float
    dry_run: bool
    interval_s: float
    early_s: float
    warm_up: bool = True
    sleep_lead_in: bool = True


class OnlineSteps:
    """Decides through each controlled step (docs/design/controller.md); run on the controller's thread. A
    :class:`~kdvfs.runtime.controller.decisions.sources.StepSource` of its first expected step; a run whose steps
    vary gives it each step's at the step's start (:meth:`take`).

    Args:
        step: the expected step (the policy over its problem, its anchors, expected time and budget share).
        clocks: what is in effect.
        context: the thread's timeline (where the anchors are asked for), host clock and event log.
        settings: budgets, timing and options (:class:`OnlineSettings`).
    """

    def __init__(self, step: OnlineStep, clocks: LiveClocks, context: ThreadContext,
                 settings: OnlineSettings) -> None:
        self.clocks, self.settings = clocks, settings
        self.timeline, self.clock, self.log = context.timeline, context.clock, context.log
        self.dry_run, self.interval_s, self.early_s = settings.dry_run, settings.interval_s, settings.early_s
        self.warm_up = WarmUp() if settings.warm_up else None
        self.budget = settings.budget
        """The policy's budget for the next steps (fraction): the settings' moved by the feedback."""
        self.next_request_s = math.inf
        self.decisions = self.advisor_reads = self.requests = self.lookaheads = self.lookahead_points = 0
        self._ahead: tuple[tuple[Any, ...] | None, float, float] = (None, math.inf, -math.inf)
        """The last look-ahead's version (what it was read from), what it found and how far it read (host s)."""
        self.progress: Counter[str] = Counter()
        self.wakes: Counter[str] = Counter()
        self.wall_us: list[float] = []
        self.policy_wall_us: list[float] = []
        self.cpu_us: list[float] = []
        self.steps_by_bucket: Counter[str] = Counter()  # steps decided through, by shape bucket
        self._decision_s = RecentDurations(BUDGET_DECISIONS)
        self._kernel = 1
        self._held: HeldChange | None = None
        self._begun = -1
        self._first = step
        self._take(step)
        prepare_states_ahead(step.online.cumulative_s)

    def _take(self, step: OnlineStep) -> None:
        self._step, self.online, self.times, self.anchor_map = step, step.online, step.times, step.anchor_map
        self._predicted, self._kernels, self._records = step.predicted, step.kernels, step.records

    def take(self, step: OnlineStep) -> None:
        """Decide the next step over ``step`` (a run whose steps vary, at each step's start, before :meth:`run`): a
        step other than the last one's begins its own policy in :meth:`run` (the first pair the last one handed
        over is replaced at once: the issuer's ``first``)."""
        if step is not self._step:
            assert step.online.labels == self.online.labels, "one clock grid for every step of a run"
            self._drop_held()
            self._take(step)
            self._begun, self._ahead = -1, (None, math.inf, -math.inf)

    @property
    def sleeps_lead_in(self) -> bool:
        """Whether the issuer sleeps through each controlled step's lead-in (``settings.sleep_lead_in``)."""
        return self.settings.sleep_lead_in

    def observe(self, end: StepEnd, matched: bool, controlled: bool) -> None:
        """Learn from a finished step of the first expected step (:meth:`OnlineStep.observe`)."""
        self._first.observe(end, matched, controlled)

    def feedback(self, measured: Interval | None) -> None:
        """Set the next steps' budget from the run's measured slowdown (:func:`fed_back_budget`; a dry run
        measures no effect of its own: the settings' budget)."""
        settings = self.settings
        self.budget = settings.budget if self.dry_run else fed_back_budget(settings.budget, settings.job_budget,
                                                                           measured)

    def run(self, step: int, start_s: float, scale: float, first: bool, stop: threading.Event,
            lead_in: Callable[[], None] | None = None) -> None:
        """Decide through step ``step``, which started at host time ``start_s`` and is expected to last ``scale``
        times the expected step time; hands over (requests step ``step + 1``'s first pair) a latency before its
        expected end. ``first``: the first controlled step after others, whose first pair is requested at once;
        ``lead_in``: called before the step's first decision (the issuer's sleep through the lead-in)."""
        step_s = scale * self._step.expected_s
        self._drop_held()
        if self._step.key:
            self.steps_by_bucket[self._step.key] += 1
        if self._begun != step:
            first_pair = self.online.begin(self.budget * self._step.budget_share)
            if first:
                self._request(first_pair, step, 0, start_s, start_s)
        if lead_in is not None:
            lead_in()
        latency_s, decision_time_s = self.clocks.latency_s, self._decision_time_s()
        anchor = (-1, start_s, 0)
        self._kernel = 1
        self._predicted.restart()
        while True:
            anchor = self._anchor(step, anchor)
            now_s = self.clock.now_s()
            end_s = self.times.end_s(anchor, start_s, step_s)
            hand_over_s = end_s - latency_s - self.early_s
            # A decision then, then the next step's first: both by then (at least as long as the last one took:
            # the first controlled step has no percentile yet).
            latest_s = self._decision_s.latest_s
            last_s = hand_over_s - 2 * (decision_time_s if latest_s is None else max(decision_time_s, latest_s))
            if now_s >= last_s:
                break
            wake_s = max(self._decide(step, start_s, now_s, anchor, last_s), now_s + MIN_GAP_S)
            self.next_request_s = min(wake_s, last_s)
            if wake_s < last_s and not self._warm_before(start_s, anchor, stop):  # a decision point is next
                return
            if not self.clock.sleep_until(self.next_request_s, stop):
                return
        self._begun = step + 1
        self.next_request_s = hand_over_s
        first_pair = self.online.begin(self.budget * self._step.budget_share)
        if not (self._release_before(anchor, hand_over_s, stop) and self.clock.sleep_until(hand_over_s, stop)):
            return
        self.next_request_s = math.inf
        self._request(first_pair, step + 1, 0, self.clock.now_s(), end_s)

    def _warm_before(self, start_s: float, anchor: PassedAnchor, stop: threading.Event) -> bool:
        """With a warm-up, before a decision point the thread would sleep to: sleep until its lead before the
        point and rehearse the point's decision there (:meth:`_live_state` at that moment, then a throwaway
        decision of the policy's, which decides on this thread); the point follows without a sleep if it is due
        by then. False if stopped."""
        if self.warm_up is None:
            return True
        warm_at_s = self.next_request_s - self.warm_up.lead_s()
        if warm_at_s <= self.clock.now_s():  # the thread does not sleep before the point: its core is warm
            return True
        if not self.clock.sleep_until(warm_at_s, stop):
            return False
        self.warm_up.run(lambda: self.online.warm(self._live_state(start_s, self.clock.now_s(), anchor)))
        return True

    def _decision_time_s(self) -> float:
        """How long a decision takes (host s, the controller's clock): the 90th percentile of the last
        ``BUDGET_DECISIONS`` decision points' (0 before any)."""
        return self._decision_s.percentile(90)

    def _decide(self, step: int, start_s: float, now_s: float, anchor: PassedAnchor, until_s: float) -> float:
        """One decision point; returns when the next is due (host s; ``until_s``: the step's last decision
        point, as far as a budget-dependent order's proposals are read ahead)."""
        began_cpu = time.thread_time()  # a system call: read before the wall clock, outside the wall time
        began = time.perf_counter()
        self._release_held(anchor, now_s)
        self.clocks.update(now_s)
        running = self._running
        state = self._live_state(start_s, now_s, anchor)
        kernel = self._kernel = state.kernel
        decision = self.online.decide(state, state.elapsed_s)
        decided_s = self.clock.now_s()
        self._decision_s.append(decided_s - now_s)
        if decision.pair not in (NO_REQUEST, self.clocks.in_effect) and self.clocks.free:
            landing = max(self._landing(anchor, decided_s), kernel + 1)
            if landing < self._kernels:  # else it lands after the step: the hand-over is next
                self._place(HeldChange(decision.pair, step, landing), anchor, decided_s)
        wall_us = (time.perf_counter() - began) * 1e6  # the decision and its request, if any, are out
        wake_s, reason = self._next_wake(decision, start_s, now_s, anchor, running, until_s)
        self.wakes[reason] += 1
        self.wall_us.append((time.perf_counter() - began) * 1e6)
        self.cpu_us.append((time.thread_time() - began_cpu) * 1e6)
        if decision.evaluated:
            self.decisions += 1
            self.policy_wall_us.append(wall_us)
            self.log.append_line(self._records.line(
                step, kernel, "anchor" if anchor[0] >= 0 else "expected", self.clocks.in_effect,
                None if self.clocks.free else self.clocks.pending, 100 * self.budget * self._step.budget_share,
                decision.budget_used,
                decision.affordable_pct, decision.action, None if decision.pair == NO_REQUEST else decision.pair,
                wall_us, reason))
        else:
            self.advisor_reads += 1
        return wake_s

    def _live_state(self, start_s: float, now_s: float, anchor: PassedAnchor) -> LiveState:
        """What the policy observes at ``now_s`` (host s) of the step that started at ``start_s``: the kernel the
        GPU is at (from ``anchor`` at the step's pace, never one before the last decision's), the clocks in
        effect and pending, and the times, on the model's timeline (docs/design/controller.md)."""
        scale, clocks = self.times.auto_scale, self.clocks
        kernel = max(self._kernel, self.times.kernel_running(anchor, self._running, now_s))
        return LiveState(kernel, clocks.in_effect, clocks.pending,
                         (now_s - clocks.requested_s) / scale if not clocks.free else 0.0,
                         (now_s - start_s) / scale, float(self.online.cumulative_s[kernel, 0]),
                         clocks.last_latency_ratio, 100.0 * (scale - 1.0),
                         self._predicted.at(kernel, clocks.in_effect))

    def _next_wake(self, decision: OnlineDecision, start_s: float, now_s: float, anchor: PassedAnchor,
                   running: int, until_s: float) -> tuple[float, str]:
        """The next decision point (host s) and its reason (docs/design/controller.md): the earliest of the
        reasons', the first named at a tie (``policy``, ``arrival``, ``issue``, then ``proposal`` or ``change``)."""
        policy_s = start_s + self.times.auto_scale * decision.policy_due_s
        arrival_s = self.clocks.arrival_check_s(now_s, self.interval_s)
        issue_s = math.inf if self._held is None else self._issue_s(anchor, self._held.kernel)
        wake_s, reason = policy_s, "policy"
        if arrival_s < wake_s:
            wake_s, reason = arrival_s, "arrival"
        if issue_s < wake_s:
            wake_s, reason = issue_s, "issue"
        if decision.next_change is None:
            proposal_s = self._proposal_s(decision, start_s, now_s, anchor, min(until_s, policy_s, arrival_s, issue_s))
            if proposal_s < wake_s:
                wake_s, reason = proposal_s, "proposal"
        elif decision.next_change < self._kernels:
            change_s = self.times.kernel_s(anchor, running, decision.next_change)
            if change_s < wake_s:
                wake_s, reason = change_s, "change"
        return wake_s, reason

    def _proposal_s(self, decision: OnlineDecision, start_s: float, now_s: float, anchor: PassedAnchor,
                    before_s: float) -> float:
        """A budget-dependent order's next proposal change (host s; infinite: none before ``before_s``): its
        proposal read ahead every decision interval from ``now_s`` at the state then expected (the kernel at the
        step's pace from ``anchor``, nothing pending), the first point where it names a pair to request; none
        while a change is pending or held (its arrival or issue wakes first). Read again only when what it was
        read from changed (the step, the anchor, the clocks in effect, the standing order) or it reached less far
        than ``before_s``."""
        clocks = self.clocks
        if not clocks.free:
            return math.inf
        version = (start_s, anchor[0], clocks.in_effect, decision.action)
        last_version, last_s, reached_s = self._ahead
        if version == last_version and now_s < last_s and (last_s < math.inf or reached_s >= before_s):
            return last_s
        points = math.ceil((before_s - now_s) / self.interval_s) - 1
        found_s, reached_s = math.inf, before_s
        if points > 0:
            n, scale = min(points, MAX_AHEAD), self.times.auto_scale
            kernels, elapsed_s, auto_elapsed_s, model_elapsed_s = states_ahead(
                self.times.array_at(self._running), anchor[2], anchor[1], now_s, self.interval_s, n, self._kernel,
                start_s, scale, self.online.cumulative_s, *self._predicted.reading(clocks.in_effect))
            index = self.online.first_change(kernels, clocks.in_effect, elapsed_s, auto_elapsed_s,
                                             clocks.last_latency_ratio, 100.0 * (scale - 1.0), model_elapsed_s)
            self.lookahead_points += min(index + 1, n)
            if index < n:
                found_s = now_s + self.interval_s * (index + 1)
            elif points > MAX_AHEAD:
                found_s = reached_s = now_s + self.interval_s * n
        self.lookaheads += 1
        self._ahead = (version, found_s, reached_s)
        return found_s

    @property
    def _running(self) -> int:
        """The pair whose kernel times the GPU runs at (a dry run changes nothing: auto's)."""
        return 0 if self.dry_run else self.clocks.in_effect

    def _issue_s(self, anchor: PassedAnchor, kernel: int) -> float:
        """When a request for a change at ``kernel`` goes out (host s): one latency, and ``early_s``, before it."""
        return self.times.kernel_s(anchor, self._running, kernel) - self.clocks.latency_s - self.early_s

    def _place(self, change: HeldChange, anchor: PassedAnchor, decided_s: float) -> None:
        """Request ``change`` now if its request is due within ``HOLD_MIN_S``, else hold it until it is."""
        if self._issue_s(anchor, change.kernel) - decided_s < HOLD_MIN_S:
            self._request(change.pair, change.step, change.kernel, decided_s,
                          self.times.kernel_s(anchor, self._running, change.kernel))
        else:
            self.clocks.hold(change.pair, decided_s)
            self._held = change

    def _landing(self, anchor: PassedAnchor, request_s: float) -> int:
        """The kernel a request made at ``request_s`` (host s) changes: it lands one latency later, and takes
        effect from the kernel after the one running then."""
        return self.times.kernel_running(anchor, self._running, request_s + self.clocks.latency_s) + 1

    def _release_held(self, anchor: PassedAnchor, now_s: float) -> None:
        """Send the held change's request if it is due by ``now_s`` (host s), planned from ``anchor`` (a later
        kernel if it is late for its own; dropped if late for the step)."""
        held = self._held
        if held is None or now_s < self._issue_s(anchor, held.kernel) - MIN_GAP_S:
            return
        kernel = max(held.kernel, self._landing(anchor, now_s))
        if kernel >= self._kernels or not self._request(
                held.pair, held.step, kernel, now_s, self.times.kernel_s(anchor, self._running, kernel)):
            self._drop_held()  # too late for the step, or a repeat of the clocks requested last
        self._held = None  # out: the clocks follow its request at their next update

    def _release_before(self, anchor: PassedAnchor, until_s: float, stop: threading.Event) -> bool:
        """At the step's end: the held change's request at its instant if that comes before ``until_s`` (host s),
        else the change is dropped (the hand-over comes first). False if stopped."""
        if self._held is None:
            return True
        issue_s = self._issue_s(anchor, self._held.kernel)
        if issue_s >= until_s:
            self._drop_held()
            return True
        self.next_request_s = issue_s
        if not self.clock.sleep_until(issue_s, stop):
            return False
        self._release_held(anchor, self.clock.now_s())
        self.next_request_s = until_s
        return True

    def _drop_held(self) -> None:
        """Forget the held change (its request never goes out)."""
        if self._held is not None:
            self._held = None
            self.clocks.drop()

    def _anchor(self, step: int, anchor: PassedAnchor) -> PassedAnchor:
        """The latest anchor the GPU has passed (index, host s, kernel), else ``anchor``; counts the source."""
        anchors = self.anchor_map.anchors
        passed = self.timeline.passed_anchor(step, anchor[0]) if anchors else None
        if passed is not None and passed[0] < len(anchors):
            anchor = (passed[0], passed[1], anchors[passed[0]].kernel)
        self.progress["anchor" if anchor[0] >= 0 else "expected"] += 1
        return anchor

    def _request(self, pair: int, step: int, kernel: int, request_s: float, due_s: float) -> bool:
        """Request ``pair`` for ``kernel`` of ``step``; False for a repeat (nothing went out)."""
        if not self.clocks.actuator.request(self.online.labels[pair], step=step, kernel=kernel, request_s=request_s,
                                            due_s=due_s, online=True):
            return False
        self.requests += 1
        return True

    def figures(self) -> OnlineFigures:
        """For the summary: the decisions' counts, wakes, progress sources and times (us; totals in ms), the
        budget the policy was given last (fraction), the decision interval (s) and the steps decided through by
        shape bucket."""
        warm_us, warm_ms = (None, None) if self.warm_up is None else self.warm_up.figures()
        return OnlineFigures(
            decisions=self.decisions, advisor_reads=self.advisor_reads, requests=self.requests,
            lookaheads=self.lookaheads, lookahead_points=self.lookahead_points, progress=dict(self.progress),
            took_effect=dict(self.clocks.took_effect), decision_us=quantiles(self.policy_wall_us),
            decision_point_us=quantiles(self.wall_us), decision_point_cpu_us=quantiles(self.cpu_us),
            cpu_ms=1e-3 * sum(self.cpu_us), warm_us=warm_us, warm_ms=warm_ms, wakes=dict(self.wakes),
            step_budget=self.budget, interval_s=self.interval_s,
            steps_by_bucket=dict(sorted(self.steps_by_bucket.items())))

