"""The plan or policy file: the step's problem and the schedule it implies.

:func:`load_plan` reads the file the controller was given, for the expected step (a kdvfs trace) and the GPU
profile, and returns a :class:`Plan`: the problem and its :class:`~kdvfs.envs.model.schedule.Schedule` (one
clock action per kernel), from a plan file (``kdvfs plan -o``, format ``kdvfs-schedule`` version 1, checked
against the profile and the trace's kernel count) or from a frozen policy's noise-free rollout
(``.kdvfs-policy.npz``), which with ``OnlineConfig.enabled`` the plan also carries to run inside each step
(:class:`~kdvfs.runtime.controller.decisions.online.OnlineSteps`).

Failure modes: a missing, unreadable or mismatched file raises :class:`ScheduleSourceError` (or the policy
file's own ``KdvfsError``) before any clock changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kdvfs.agents.common.problem import Planner, Problem, rank_budget
from kdvfs.agents.learned.policy.shipped import policy_source_path
from kdvfs.common.errors import KdvfsError
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile, profile_for_nvml_name
from kdvfs.envs.model.schedule import Schedule
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.runtime.controller.config import ControllerConfig

if TYPE_CHECKING:
    from kdvfs.agents.learned.policy.deciders import OnlineDecider

PLAN_FORMAT, PLAN_VERSION = "kdvfs-schedule", 1
ZIP_MAGIC = b"PK\x03\x04"


class ScheduleSourceError(KdvfsError):
    """A plan or policy file that cannot drive this trace on this GPU."""


@dataclass(frozen=True)
class Plan:
    """The step's problem (trace, profile, budget, latency), the schedule to apply (or expect, when a policy
    decides online), where it came from and how it runs (``policy NAME (online)``, ``(replayed)``, ``plan NAME
    (METHOD)``; a residual policy's ``residual policy NAME ...``), the online policy (None: the schedule is
    replayed), the policy file's name (None: a plan) and the kind of policy (``policy``, ``residual policy``)."""

    problem: Problem
    schedule: Schedule
    source: str
    online: OnlineDecider | None = None
    policy_name: str | None = None
    policy_kind: str = "policy"


def is_policy_file(path: Path) -> bool:
    """Whether ``path`` holds a frozen policy (a zip archive); False when it cannot be read."""
    try:
        with path.open("rb") as file:
            return file.read(len(ZIP_MAGIC)) == ZIP_MAGIC
    except OSError:
        return False


def _read_plan_document(path: Path) -> dict[str, Any] | None:
    """The plan file's JSON document, or None for a frozen policy (a zip archive)."""
    if is_policy_file(path):
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ScheduleSourceError(f"{path}: no such plan or policy file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ScheduleSourceError(f"{path}: neither a kdvfs plan (JSON) nor a frozen policy ({error})") from None
    if not isinstance(document, dict) or (document.get("format"), document.get("version")) != (PLAN_FORMAT,
                                                                                               PLAN_VERSION):
        raise ScheduleSourceError(f"{path}: not a {PLAN_FORMAT} version {PLAN_VERSION} file; write one with "
                                  "`kdvfs plan ... -o plan.json` or pass a frozen policy (.kdvfs-policy.npz)")
    return document


def _profile(config: ControllerConfig, document: dict[str, Any] | None, device_name: str) -> GpuProfile:
    if config.gpu:
        return load_profile(config.gpu)
    if document is not None:
        return load_profile(str(document.get("gpu")))
    return profile_for_nvml_name(device_name)


def _plan_schedule(path: Path, document: dict[str, Any], problem: Problem) -> Schedule:
    """The plan's segments as one action per kernel of ``problem``."""
    costs, gpu = problem.costs, problem.profile.name
    if document.get("gpu") != gpu:
        raise ScheduleSourceError(f"{path}: plan was made for GPU profile {document.get('gpu')!r}, not {gpu!r}; make "
                                  f"one for this GPU with `kdvfs plan --gpu {gpu} ...`")
    if document.get("kernels") != costs.kernels:
        raise ScheduleSourceError(f"{path}: plan covers {document.get('kernels')} kernels, the trace "
                                  f"{problem.trace.meta.workload!r} has {costs.kernels}; plan this trace with "
                                  "`kdvfs plan --trace ...`")
    try:
        starts = [int(s["start_kernel"]) for s in document.get("segments") or []]
        clocks = [str(s["clocks"]) for s in document.get("segments") or []]
    except (KeyError, TypeError, ValueError) as error:
        raise ScheduleSourceError(f"{path}: damaged segments ({type(error).__name__}: {error}); write the plan again "
                                  "with `kdvfs plan ... -o plan.json`") from None
    if not starts or starts[0] != 0 or starts != sorted(set(starts)) or starts[-1] >= costs.kernels:
        raise ScheduleSourceError(f"{path}: segments must start at kernel 0 and increase within the step")
    try:
        labels = [costs.index_of(text) for text in clocks]
    except ValueError as error:
        raise ScheduleSourceError(f"{path}: {error}; make the plan with this GPU's profile") from None
    lengths = np.diff([*starts, costs.kernels])
    return Schedule(np.repeat(labels, lengths).astype(np.int64), str(document.get("method", "plan")),
                    float(document.get("solve_s", 0.0)))


def _policy_plan(path: Path, problem: Problem, online: bool) -> Plan:
    """The frozen policy's noise-free schedule over ``problem`` (through the planner interface) and, with
    ``online``, the policy to run inside each step."""
    from kdvfs.agents.learned.policy.deciders import online_decider
    from kdvfs.agents.learned.policy.frozen import FrozenPolicy
    from kdvfs.agents.learned.policy.policy_planner import PolicyPlanner, policy_env

    policy = FrozenPolicy.load(path, problem.profile)
    env = policy_env(policy, problem)  # built once: the rollout's and the online policy's
    schedule = PolicyPlanner(policy).plan(problem, env)
    kind = "residual policy" if policy.config.residual_actions else "policy"
    source = f"{kind} {path.name} ({'online' if online else 'replayed'})"
    return Plan(problem, schedule, source, online_decider(policy, problem, env) if online else None, path.name, kind)


def load_plan(config: ControllerConfig, device_name: str) -> Plan:
    """The problem and schedule ``config`` describes, on the GPU called ``device_name`` (its NVML name, which
    the profile's ``nvml_names`` must list)."""
    try:
        path = policy_source_path(config.policy)
    except KdvfsError as error:
        raise ScheduleSourceError(str(error)) from None
    document = _read_plan_document(path)
    profile = _profile(config, document, device_name)
    if not profile.applies_to(device_name):
        what = "policy" if document is None else f"plan {path.name}"
        raise ScheduleSourceError(f"the {what} is for GPU profile {profile.name!r} ({profile.model}), but the GPU is "
                                  f"an {device_name}; use a plan or policy made for this GPU's profile (`kdvfs gpus "
                                  "local --write`, then `kdvfs plan --gpu ...`)")
    trace = open_trace(config.trace)
    problem = Problem.build(trace, profile, rank_budget(trace, config.budget), config.latency_s)
    if document is None:
        return _policy_plan(path, problem, config.online.enabled)
    return Plan(problem, _plan_schedule(path, document, problem), f"plan {path.name} ({document.get('method')})")


def bucket_planner(plan: Plan, config: ControllerConfig) -> Planner:
    """What plans each shape bucket of a run whose steps vary
    (:mod:`kdvfs.runtime.controller.shapes.book`): the policy's noise-free rollout for a policy file,
    else the plan's own method where it is a planner's, else the latency-optimal planner."""
    from kdvfs.agents.planners.registry import PLANNERS, make_planner

    if plan.online is not None or plan.schedule.method == "policy":
        from kdvfs.agents.learned.policy.frozen import FrozenPolicy
        from kdvfs.agents.learned.policy.policy_planner import PolicyPlanner

        return PolicyPlanner(FrozenPolicy.load(policy_source_path(config.policy), plan.problem.profile))
    return make_planner(plan.schedule.method if plan.schedule.method in PLANNERS else "latency-optimal")
