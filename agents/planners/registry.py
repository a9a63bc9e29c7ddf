"""Every decision maker by name: what ``kdvfs plan --method`` and ``kdvfs compare`` accept."""

from __future__ import annotations

from collections.abc import Callable

from kdvfs.agents.common.problem import Planner
from kdvfs.agents.planners.latency_optimal import LatencyOptimal
from kdvfs.agents.planners.reactive import ReactiveGovernor
from kdvfs.agents.planners.static_plans import Auto, IlpGlobal, PerKernelBudget, PerPhase, StaticPair
from kdvfs.common.errors import KdvfsError

PLANNERS: dict[str, Callable[[], Planner]] = {
    "auto": Auto,
    "static": StaticPair,
    "per-phase": PerPhase,
    "greedy": PerKernelBudget,
    "reactive": ReactiveGovernor,
    "ilp": IlpGlobal,
    "ilp-local": lambda: PerKernelBudget(name="ilp-local"),
    "latency-optimal": LatencyOptimal,
}
COMPARED = ("auto", "static", "per-phase", "greedy", "reactive", "ilp", "latency-optimal")
"""The methods ``kdvfs compare`` runs (``ilp-local`` is the same plan as ``greedy``)."""


def make_planner(name: str) -> Planner:
    """A planner by name; unknown names are a clear error listing the known ones."""
    try:
        return PLANNERS[name]()
    except KeyError:
        raise KdvfsError(f"unknown method {name!r}; choose one of {', '.join(PLANNERS)}") from None
