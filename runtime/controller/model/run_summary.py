"""The run summary's types: what ``kdvfs run --json`` prints, ``Controller.summary`` holds and the event log
ends with (docs/schemas/run-summary.schema.json). Frozen records, read by attribute; ``to_json()`` is the JSON
edge, where seconds become the ``_ms`` keys and fractions the ``_pct`` keys that name them. The measured and
predicted effects (``*_pct``) are percent inside too. ``schema_version`` changes when a key changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kdvfs.runtime.controller.model.json_form import JsonFormError, JsonRecord, in_ms, in_pct, named

SCHEMA_VERSION = 2


@dataclass(frozen=True)
class Quantiles(JsonRecord):
    """Median and p99 of some values (None: no value)."""

    median: float | None
    p99: float | None


@dataclass(frozen=True)
class AnchorFigures(JsonRecord):
    """Requests placed on anchors, on the step-level timeline, fallbacks (anchor missing or rejected), the
    anchors learned, how they were mapped, and the model blocks hooked (None: no hooks)."""

    anchored: int
    step_level: int
    missing: int
    rejected: int
    learned: int
    mapped_by: str
    blocks: int | None


@dataclass(frozen=True)
class OnlineFigures(JsonRecord):
    """A policy deciding online: its decisions' counts, wakes and progress sources, their times, the budget it
    was given last (fraction), the decision interval (s) and, in a run whose steps vary, the steps it decided
    through by shape bucket (empty in a run of one shape)."""

    decisions: int
    advisor_reads: int
    requests: int
    lookaheads: int
    lookahead_points: int
    progress: dict[str, int]
    took_effect: dict[str, int]
    decision_us: Quantiles
    decision_point_us: Quantiles
    decision_point_cpu_us: Quantiles
    cpu_ms: float
    warm_us: Quantiles | None
    warm_ms: float | None
    wakes: dict[str, int]
    step_budget: float = field(metadata=in_pct("step_budget_pct"))
    interval_s: float = field(metadata=in_ms("interval_ms"))
    steps_by_bucket: dict[str, int]


@dataclass(frozen=True)
class ShapeFigures(JsonRecord):
    """A run whose steps vary: the buckets planned, the budgets they were planned at (``margins``, fractions of
    the run's budget, the prediction margin included: :mod:`kdvfs.agents.planners.prediction_margin`) and the one
    in use, the steps that ran in each (by bucket), the controlled ones
    that replayed their bucket's schedule (by bucket; a frozen policy's until its bucket decides online),
    those without an entry by reason (``no_shape``, ``no_plan``) and the basis the step model's fits are on
    (``quadratic``, ``attention``, ``linear``, ``size``, ``constant``: :class:`~kdvfs.envs.model.step.shape_fit.Terms`;
    None where the shapes' steps do not come from a step model)."""

    buckets: int
    quantum_tokens: int
    quanta: list[int]
    margins: list[float]
    margin: float
    margin_changes: int
    prediction_margin: float
    planned_in_background: int
    plan_error: str | None
    stood_in: int
    steps_by_bucket: dict[str, int]
    replayed_steps_by_bucket: dict[str, int]
    misses: dict[str, int]
    step_model_basis: str | None


@dataclass(frozen=True)
class LeadIn(JsonRecord):
    """Lead-ins slept through, those whose first anchor came late (and by how much, s) and never came."""

    waits: int
    late: int
    missed: int
    late_s: Quantiles = field(metadata=in_ms("late_ms"))


@dataclass(frozen=True)
class ControllerCpu(JsonRecord):
    """The controller thread's CPU time (s) and its parts, and the hooks' (None: not recorded)."""

    thread_s: float = field(metadata=in_ms("thread"))
    thread_end_wait_s: float = field(metadata=in_ms("thread_end_wait"))
    thread_issue_s: float = field(metadata=in_ms("thread_issue"))
    hooks_s: float | None = field(metadata=in_ms("hooks"))


@dataclass(frozen=True)
class HostCost(JsonRecord):
    """The controller's CPU (s) in all and per step, the per-step total's share of the step time (fraction; None
    before two step ends), and the thread's wakes (of them, the GPU timeline's looks at its events: None where the
    timeline has none), the CPU of the training process's threads that serve the controller (the event poller and
    the shape server) and, for a controller in its own process, the training process's share (hooks and those;
    None in process) (:mod:`kdvfs.runtime.controller.measurement.host_cost`)."""

    thread_s: float = field(metadata=in_ms("thread_ms"))
    energy_thread_s: float | None = field(metadata=in_ms("energy_thread_ms"))
    hooks_s: float | None = field(metadata=in_ms("hooks_ms"))
    total_s: float = field(metadata=in_ms("total_ms"))
    per_step_s: float | None = field(metadata=in_ms("per_step_ms"))
    thread_per_step_s: float | None = field(metadata=in_ms("thread_per_step_ms"))
    step_share: float | None = field(metadata=in_pct("step_share_pct"))
    thread_step_share: float | None = field(metadata=in_pct("thread_step_share_pct"))
    wakes: int
    wakes_per_step: float | None
    server_s: float | None = field(default=None, metadata=in_ms("server_ms"))
    training_step_share: float | None = field(default=None, metadata=in_pct("training_step_share_pct"))
    timeline_wakes: int | None = None


@dataclass(frozen=True)
class RequestFigures(JsonRecord):
    """Clock requests planned ahead of their change, the late ones, their share and lateness (s)."""

    planned: int
    late: int
    late_share: float | None
    late_s: Quantiles = field(metadata=in_ms("late_ms"))


@dataclass(frozen=True)
class EnergyCounter(JsonRecord):
    """The energy counter's reads (all; to learn its clock; to measure a change again), the median read (s),
    the update period learned (s; None: none) and the reading thread's CPU (s; of it, learning the clock: a
    one-time cost, which weighs per step only in a short run; None in logs written before it)."""

    reads: int
    calibration_reads: int
    relock_reads: int
    read_s: float | None = field(metadata=in_ms("read_ms"))
    update_period_s: float | None = field(metadata=in_ms("update_period_ms"))
    thread_cpu_s: float | None
    calibration_cpu_s: float | None = None


@dataclass(frozen=True)
class Measured(JsonRecord):
    """The measured effect while controlling (%, with 95% intervals; None: fewer than two pairs), and the
    windows at auto and entirely controlled it rests on."""

    energy_saved_pct: float | None
    energy_saved_ci95_pct: list[float] | None
    slowdown_pct: float | None
    slowdown_ci95_pct: list[float] | None
    windows_auto: int
    windows_controlled: int


@dataclass(frozen=True)
class NetEffect(JsonRecord):
    """The effect over the whole run (%): :class:`Measured`'s times the share of steps controlled."""

    energy_saved_pct: float | None
    energy_saved_ci95_pct: list[float] | None
    slowdown_pct: float | None
    slowdown_ci95_pct: list[float] | None
    controlled_share: float


@dataclass(frozen=True)
class Predicted(JsonRecord):
    """The cost model's saving and slowdown of the plan (%), its switches and solve time (s), and their range
    (the ``range.schema.json`` change object; None in logs written before ranges)."""

    energy_saved_pct: float
    slowdown_pct: float
    switches: int
    solve_s: float
    range: dict[str, Any] | None


def _versioned(document: dict[str, Any]) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, **document}


def _check_version(document: Any, name: str) -> dict[str, Any]:
    if not isinstance(document, dict) or document.get("schema_version") != SCHEMA_VERSION:
        found = document.get("schema_version") if isinstance(document, dict) else None
        raise JsonFormError(f"{name} of schema version {found}, not {SCHEMA_VERSION} (another kdvfs version's)")
    return {key: value for key, value in document.items() if key != "schema_version"}


@dataclass(frozen=True)
class RunSummary(JsonRecord):
    """One training process's run (one rank's): the GPU and plan, the steps and requests, what the guard did,
    errors (None: none), the parts' figures, the A/B measurement, the prediction and whether the GPU is back at
    its own clock control. Keys and their meaning: docs/schemas/run-summary.schema.json."""

    rank: int | None
    world_size: int
    gpu_index: int | None
    source: str
    gpu: str
    trace: str
    dry_run: bool
    clock_control: str
    steps: int
    controlled_steps: int
    switches: int
    mismatches: int
    backed_off: bool
    backoff_reason: str
    guard_backoffs: int
    guard_slowdown_pct: float | None
    guard_off: str | None
    not_measured_on_a_gpu: str | None
    error: str | None
    observe_only: str | None
    restore_error: str | None
    anchors: AnchorFigures
    online_decisions: int | None
    online: OnlineFigures | None
    shapes: ShapeFigures | None
    auto_reasons: dict[str, int]
    lead_in: LeadIn
    controller_cpu: ControllerCpu = field(metadata=named("controller_cpu_ms"))
    host_cost: HostCost
    requests: RequestFigures
    window_steps: int
    windows: int
    step_time_s: float | None
    energy_j_per_step: float | None
    energy_j_per_step_auto: float | None
    energy_j_per_step_controlled: float | None
    measured: Measured
    measured_net: NetEffect
    ab_share: float
    energy_measured: bool
    energy_reads: int | None
    energy_counter: EnergyCounter | None
    predicted: Predicted
    gpu_restored: bool | None

    def to_json(self) -> dict[str, Any]:
        return _versioned(super().to_json())

    @classmethod
    def from_json(cls, document: Any, scale: float = 1.0) -> RunSummary:
        return super().from_json(_check_version(document, "a run summary"), scale)


@dataclass(frozen=True)
class RankRow(JsonRecord):
    """One rank's own figures in a job summary (see :class:`RunSummary` for their meaning)."""

    rank: int | None
    gpu_index: int | None
    steps: int
    controlled_steps: int
    switches: int
    mismatches: int
    step_time_s: float | None
    energy_j_per_step: float | None
    energy_j_per_step_auto: float | None
    energy_j_per_step_controlled: float | None
    measured: Measured
    predicted: Predicted
    backed_off: bool
    error: str | None
    restore_error: str | None
    gpu_restored: bool | None
    observe_only: str | None

    @classmethod
    def of(cls, summary: RunSummary) -> RankRow:
        return cls(**{name: getattr(summary, name) for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class EndedRank(JsonRecord):
    """A rank that ended without writing its summary: whether its GPU is back at its own clock control (None:
    unknown)."""

    rank: int
    gpu_restored: bool | None


@dataclass(frozen=True)
class JobSummary:
    """What ``kdvfs run`` reports: the job's figures (one rank's own, or the ranks' combined:
    :mod:`kdvfs.runtime.controller.measurement.job_summary`), each rank's row, and ``partial`` when some rank
    ended without a summary. Written flat: the summary's keys, then ``ranks`` (and ``partial``)."""

    summary: RunSummary
    ranks: list[RankRow | EndedRank]
    partial: bool = False

    def to_json(self) -> dict[str, Any]:
        return {**self.summary.to_json(), "ranks": [rank.to_json() for rank in self.ranks],
                **({"partial": True} if self.partial else {})}

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> JobSummary:
        """The job summary ``kdvfs run --json`` printed (raises :class:`JsonFormError` as
        :meth:`RunSummary.from_json`)."""
        rest = {key: value for key, value in document.items() if key not in ("ranks", "partial")}
        ranks = [EndedRank.from_json(row) if set(row) == {"rank", "gpu_restored"} else RankRow.from_json(row)
                 for row in document.get("ranks", [])]
        return cls(RunSummary.from_json(rest), ranks, bool(document.get("partial", False)))


@dataclass(frozen=True)
class EndedSummary(JsonRecord):
    """What ``kdvfs run`` reports when no training process wrote its summary: the error, whether every GPU is
    back at its own clock control (None: unknown), ``partial`` (always True), what the log measured so far
    (:func:`kdvfs.runtime.controller.training.ended.measured_so_far`), the ranks and the clock control."""

    error: str
    gpu_restored: bool | None
    partial: bool
    steps: int | None
    windows: int
    measured: Measured | None
    ranks: list[EndedRank]
    clock_control: str

    def to_json(self) -> dict[str, Any]:
        return _versioned(super().to_json())
