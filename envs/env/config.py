"""Every setting of ``KernelDVFS-v0`` in one place: :class:`EnvConfig`.

The environment's constructor, PPO training (the ``env:`` section of ``configs/ppo/<gpu>.yaml`` loads into
it), frozen policies (which store it) and policy evaluation all read their settings from it. Its defaults are
``KernelDVFS-v0``'s and the shipped policies' (``configs/ppo/<gpu>.yaml`` overrides only what differs per GPU).
Switching figures left as None come from the GPU profile (:meth:`EnvConfig.switching`).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.env.dynamics import MEASURED_DRIFT, DisturbanceSettings
from kdvfs.envs.env.observing.observation import ObservationSpec
from kdvfs.envs.env.steps.clock_grid import ClockGrid
from kdvfs.envs.gpu.profiles import GpuProfile


class Switching(NamedTuple):
    """The clock-switching figures an environment runs with (s)."""

    latency_s: float
    latency_std_s: float
    stall_s: float


@dataclass(frozen=True)
class EnvConfig:
    """Settings of ``KernelDVFS-v0`` (the arguments besides its steps and GPU profile).

    Attributes:
        budgets: the budgets to draw from, one per episode (a budget: the allowed step-time increase over auto,
            a fraction; 0.01 = 1%).
        latency_s: mean switching latency (s); None: the profile's. 0 = ideal switching.
        latency_scales: each episode runs at one of these multiples of the mean latency (and of its spread;
            0: ideal switching, no stall), drawn with the step and budget; one value: no draw.
        latency_std_s: spread (standard deviation) of the switching latency (s); None: the profile's, or 0
            with ideal switching.
        stall_s: GPU stall per clock change (s); None: the profile's, or 0 with ideal switching.
        latency_noise: draw each request's latency from N(latency_s, latency_std_s), clipped at 0; else the
            mean.
        duration_noise: sigma of the log-normal multiplicative noise on each kernel's time and energy (drawn
            per episode; dimensionless, 0 disables it).
        drift: model the thermal drift of the power-limited auto clock (:mod:`kdvfs.envs.env.dynamics`).
        drift_pct: the drift: auto mode's step time, and every pair's energy, rise by this much at ``drift_s``
            into training, levelling off (%; the default is :class:`kdvfs.envs.model.drift.DriftModel`'s H200
            figure).
        drift_s: time at which the drift reaches ``drift_pct`` (s).
        run_start_s: an episode's run starts uniformly within this long into training (s), which sets its drift.
        step_jitter: each step of a run gets one factor on its time and one on its energy (their spreads:
            :class:`kdvfs.envs.model.drift.DriftModel`'s H200 step-to-step figures).
        run_steps: consecutive repetitions of the step per episode (a run); the budget holds for the run as a
            whole, so slack of a fast step can pay for a slower one.
        overrun_penalty: reward lost per percent of the step's auto time beyond the budget (reward / %).
        violation_penalty: reward lost once by an episode that ends beyond its budget at all (reward).
        decision_latencies: least time between decision points, in switching latencies (with ideal switching
            every kernel is a decision point).
        decision_fraction: an action holds (re-issued at every decision point as a standing order) until at
            least this share of the run's auto time has passed: the agent decides about 1 / decision_fraction
            times per run (0: at every decision point).
        next_kernels: how many coming kernels the observation shows individually (kernels).
        window_latencies: lengths of the look-ahead windows, in switching latencies.
        plan_budgets: the budgets (fractions) of the plan advisors (:mod:`kdvfs.envs.env.advice.plan_advice`), at least
            one: the action picks which budget's latency-aware plan to follow from here (or the fitting plan, or
            the budget's plan).
        core_fractions: locked core levels of the clock grid, as fractions of the profile's maximum core clock
            (:class:`kdvfs.envs.env.steps.clock_grid.ClockGrid`; auto is always level 0).
        memory_mhz: memory clocks of the clock grid (MHz, descending); None: all of the profile's.
        residual_actions: the honest, residual design (``KernelDVFSResidual-v0``,
            :class:`kdvfs.envs.env.residual_env.ResidualDVFSEnv`): the observation is what a controller measures
            (:mod:`kdvfs.envs.env.observing.measured`) and the action a residual over the fitting plan's pair and a
            margin on the budget, decided at segment boundaries and budget events.
        anchors_per_step: with ``residual_actions``, anchors a controller sees per step, evenly spread over its
            kernels (the first at kernel 0): the position is extrapolated from the last one passed through the
            clocks seen in effect since, at the step's pace between anchors as measured (never past the next
            anchor).
        drift_sd_pct: with ``residual_actions``, the error of the drift the A windows measure (auto's step time
            over the prediction's: the executed step's own error and the true drift together; %, sd; drawn once
            per episode), and the relative error (the same number, in %) of each measured pace between anchors.
        budget_events: with ``residual_actions``, the agent also decides each time the run's progress passes
            another 1 / budget_events of its auto time (0: only at segment boundaries).
        min_segment_s: the plan advisors' shortest segment (s) whatever the switching latency (the plans' segments
            last at least the larger of this and the latency plus its spread). With ideal switching a plan may
            otherwise change clocks at every kernel, and a controller that places itself by anchors (misplaced by a
            kernel at about a quarter of its decisions) lands those clocks on the wrong kernels. 0: no floor.
        every_core_clock: the locked core levels are every core clock the profile supports (at its highest
            memory clock) from the lowest to the highest of ``core_fractions``, so that no pair a planner can
            choose in that range is missing (on an H200: 54 levels from 1185 to 1980 MHz in 15 MHz steps).
    """

    budgets: tuple[float, ...] = (0.01, 0.0, 0.0025, 0.005, 0.0075, 0.0125, 0.015, 0.02, 0.03, 0.05)
    latency_s: float | None = None
    latency_scales: tuple[float, ...] = (0.0, 1.0, 2.0)
    latency_std_s: float | None = None
    stall_s: float | None = None
    latency_noise: bool = True
    duration_noise: float = 0.02
    drift: bool = True
    drift_pct: float = MEASURED_DRIFT.time_drift_pct
    drift_s: float = MEASURED_DRIFT.drift_s
    run_start_s: float = MEASURED_DRIFT.drift_s
    step_jitter: bool = True
    run_steps: int = 1
    overrun_penalty: float = 10.0
    violation_penalty: float = 2.5
    decision_latencies: float = 0.1
    decision_fraction: float = 0.125
    next_kernels: int = 2
    window_latencies: tuple[float, ...] = (1.0, 2.0, 4.0)
    plan_budgets: tuple[float, ...] = (0.0, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03,
                                       0.04, 0.05)
    core_fractions: tuple[float, ...] = (1.0, 0.6)
    memory_mhz: tuple[int, ...] | None = None
    every_core_clock: bool = True
    residual_actions: bool = False
    anchors_per_step: int = 9
    drift_sd_pct: float = 0.15
    budget_events: int = 8
    min_segment_s: float = 0.0

    def __post_init__(self) -> None:
        # Sequences become tuples of floats (ints) so that equal settings give equal observation-spec hashes.
        for name in ("budgets", "latency_scales", "window_latencies", "plan_budgets", "core_fractions"):
            object.__setattr__(self, name, tuple(float(value) for value in getattr(self, name)))
        if self.memory_mhz is not None:
            object.__setattr__(self, "memory_mhz", tuple(int(mhz) for mhz in self.memory_mhz))
        if not self.budgets or min(self.budgets) < 0 or not self.plan_budgets or min(self.plan_budgets) < 0:
            raise KdvfsError(f"budgets {list(self.budgets)} and plan_budgets {list(self.plan_budgets)} must be "
                             "non-empty lists of fractions >= 0")
        if any(value is not None and value < 0 for value in (self.latency_s, self.latency_std_s, self.stall_s)):
            raise KdvfsError("latency_s, latency_std_s and stall_s must be >= 0 (or None: the profile's)")
        if not self.latency_scales or min(self.latency_scales) < 0:
            raise KdvfsError(f"latency_scales {list(self.latency_scales)} must be a non-empty list of multiples >= 0")
        if self.decision_latencies < 0 or self.next_kernels < 1 or not self.window_latencies \
                or min(self.window_latencies) <= 0 or self.duration_noise < 0:
            raise KdvfsError("need decision_latencies >= 0, next_kernels >= 1, positive window_latencies and "
                             "duration_noise >= 0")
        if not 0.0 <= self.decision_fraction < 1.0:
            raise KdvfsError(f"decision_fraction {self.decision_fraction} must be in [0, 1)")
        if self.anchors_per_step < 1 or self.drift_sd_pct < 0 or self.budget_events < 0 or self.min_segment_s < 0:
            raise KdvfsError("need anchors_per_step >= 1, drift_sd_pct >= 0, budget_events >= 0 and "
                             "min_segment_s >= 0")
        if self.drift_pct < 0 or self.drift_s <= 0 or self.run_start_s < 0 or self.run_steps < 1:
            raise KdvfsError("need drift_pct >= 0, drift_s > 0, run_start_s >= 0 and run_steps >= 1")

    def replace(self, **settings: Any) -> EnvConfig:
        """A copy with the given fields replaced; an unknown name is a :class:`KdvfsError`."""
        unknown = sorted(set(settings) - {field.name for field in dataclasses.fields(self)})
        if unknown:
            raise KdvfsError(f"unknown environment setting(s) {unknown}; allowed: "
                             f"{[field.name for field in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **settings)

    def without_disturbances(self) -> EnvConfig:
        """A copy with every disturbance off: mean latency, no duration noise, drift or step jitter."""
        return self.replace(latency_noise=False, duration_noise=0.0, drift=False, step_jitter=False)

    def with_disturbances(self) -> EnvConfig:
        """A copy with every disturbance on (duration noise as set): latency spread, drift, step jitter."""
        return self.replace(latency_noise=True, drift=True, step_jitter=True)

    def disturbances(self, switching: Switching) -> DisturbanceSettings:
        """The disturbance settings with the environment's switching figures."""
        return DisturbanceSettings(self.duration_noise, self.drift_pct if self.drift else 0.0, self.drift_s,
                                   self.run_start_s, self.step_jitter, self.latency_noise, switching.latency_s,
                                   switching.latency_std_s)

    def grid(self, profile: GpuProfile) -> ClockGrid:
        """The clock grid of these settings on ``profile``."""
        return ClockGrid.for_profile(profile, self.core_levels(profile), self.memory_mhz)

    def core_levels(self, profile: GpuProfile) -> tuple[float, ...]:
        """The grid's locked core levels as fractions of ``profile``'s maximum core clock: ``core_fractions``,
        or with ``every_core_clock`` each supported core clock within their range."""
        if not self.every_core_clock:
            return self.core_fractions
        top_mhz = profile.clocks.max_core_mhz
        low_mhz, high_mhz = min(self.core_fractions) * top_mhz, max(self.core_fractions) * top_mhz
        supported = profile.clocks.core_mhz[profile.clocks.memory_mhz[0]]
        step_mhz = min(b - a for a, b in zip(sorted(supported), sorted(supported)[1:], strict=False))
        return tuple(core / top_mhz for core in sorted(supported, reverse=True)
                     if low_mhz - step_mhz / 2 <= core <= high_mhz + step_mhz / 2)

    def observation_spec(self, grid: ClockGrid) -> ObservationSpec:
        """The observation layout of these settings on ``grid``."""
        return ObservationSpec(grid, self.next_kernels, self.window_latencies, self.plan_budgets)

    def switching(self, profile: GpuProfile) -> Switching:
        """Latency, its spread and the stall (s): these settings', else ``profile``'s (0 with ideal switching)."""
        latency_s = profile.switching.latency_mean_s if self.latency_s is None else self.latency_s
        if self.latency_std_s is not None:
            latency_std_s = self.latency_std_s
        else:
            latency_std_s = profile.switching.latency_std_s if latency_s > 0 else 0.0
        if self.stall_s is not None:
            stall_s = self.stall_s
        else:
            stall_s = profile.cost_param("switch_stall_s") if latency_s > 0 else 0.0
        return Switching(float(latency_s), float(latency_std_s), float(stall_s))


def settings_table() -> str:
    """:class:`EnvConfig`'s fields as a Markdown table (setting, default, meaning), the meanings from its
    docstring."""
    attributes = (inspect.getdoc(EnvConfig) or "").split("Attributes:\n", 1)[1]
    meanings = dict(re.findall(r"^    (\w+): (.*?)(?=^    \w+: |\Z)", attributes, re.MULTILINE | re.DOTALL))
    rows = ["| setting | default | meaning |", "| --- | --- | --- |"]
    for field in dataclasses.fields(EnvConfig):
        default = field.default
        shown = f"({default[0]}, ..., {default[-1]})` ({len(default)} values)" if isinstance(default, tuple) \
            and len(default) > 4 else f"{default!r}`"
        meaning = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", " ".join(meanings[field.name].split()))
        rows.append(f"| `{field.name}` | `{shown} | {meaning} |")
    return "\n".join(rows)
