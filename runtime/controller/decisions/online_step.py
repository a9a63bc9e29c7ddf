"""The expected step an online policy decides over (:class:`OnlineStep`): the policy over the step's problem,
where its kernels fall in host time, and the budget share it runs at.

A run of one shape has one; a run whose steps vary has one per shape bucket and margin
(:mod:`kdvfs.runtime.controller.shapes.bucket_decisions`), and
:class:`~kdvfs.runtime.controller.decisions.online.OnlineSteps` takes the step's at each step start
(:meth:`~kdvfs.runtime.controller.decisions.online.OnlineSteps.take`).
Invariant: every step of one run has the same clock grid (one policy file, one GPU profile), so a pair index
means the same clocks in each.
"""

from __future__ import annotations

from kdvfs.agents.learned.policy.deciders import OnlineDecider
from kdvfs.envs.env.observing.live import PredictedElapsed
from kdvfs.runtime.controller.decisions.decision_records import DecisionRecords
from kdvfs.runtime.controller.timing.anchors import Anchors
from kdvfs.runtime.controller.timing.gpu_timeline import StepEnd
from kdvfs.runtime.controller.timing.step_times import StepTimes


class OnlineStep:
    """One expected step of an online policy.

    Args:
        online: the policy over the step's problem (prepared: ``prepare``).
        anchors: the step's anchors (the same the entry's requests are placed on; they learn from its steps).
        expected_s: the expected step time on the plan's timeline (s).
        budget_share: the share of the run's (fed-back) budget the policy is given in this step (the shape
            bucket's margin; 1 in a run of one shape).
        key: the shape bucket's label (``""`` in a run of one shape).
    """

    def __init__(self, online: OnlineDecider, anchors: Anchors, expected_s: float, budget_share: float = 1.0,
                 key: str = "") -> None:
        self.online, self.anchor_map, self.expected_s = online, anchors.map, expected_s
        self.budget_share, self.key = budget_share, key
        self.times = StepTimes(online.cumulative_s, online.auto_time_s, anchors.map, anchors.pace)
        self.predicted = PredictedElapsed(online.cumulative_s, online.env.stall_s, online.elapsed_factors)
        self.kernels = len(online.cumulative_s) - 1
        self.records = DecisionRecords(online.labels)

    def observe(self, end: StepEnd, matched: bool, controlled: bool) -> None:
        """Learn from a finished step that ran this one (:meth:`StepTimes.observe`)."""
        self.times.observe(end, matched, controlled)
