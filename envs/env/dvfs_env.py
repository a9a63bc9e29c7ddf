"""``KernelDVFS-v0``: choose GPU clocks kernel by kernel through one training step (a Gymnasium env).

Execution follows :mod:`kdvfs.envs.model.schedule` (a kernel runs at the clocks in effect when it starts, a change
stalls the GPU for ``stall_s``, the step starts with its first clocks in effect), with requests issued
online: a request made before kernel k takes effect one switching latency later, at the first kernel that
starts after it, and the controller holds one request at a time. The clocks that ran (:attr:`applied`)
priced with :func:`kdvfs.envs.model.schedule.replay` give exactly the episode's time and energy.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from kdvfs.common.arrays import Array
from kdvfs.common.errors import KdvfsError
from kdvfs.envs.env.advice.landings import Landings
from kdvfs.envs.env.advice.plan_advice import EPS, plan_for_budget
from kdvfs.envs.env.config import EnvConfig, settings_table
from kdvfs.envs.env.dynamics import Disturbances, core_fractions, draw
from kdvfs.envs.env.execution import StepExecution
from kdvfs.envs.env.observing.dynamic_observation import layout
from kdvfs.envs.env.observing.live import LiveState
from kdvfs.envs.env.observing.live_tables import LiveTables, observe_at, target_pair_of
from kdvfs.envs.env.observing.observation import OBS_LIMIT, advisor_index, observation_table
from kdvfs.envs.env.reward import Reference, overrun_pct, reward_fn
from kdvfs.envs.env.steps.step_data import StepData, step_index
from kdvfs.envs.env.steps.workloads import default_step
from kdvfs.envs.env.timing import decision_data, regime_index, timings
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile

ENV_ID = "KernelDVFS-v0"


class KernelDVFSEnv(gym.Env[np.ndarray, np.ndarray], StepExecution):
    """Pick the core and memory clocks for the kernels of a training step, saving energy within a time budget.

    ## Description
    An episode is a run of ``run_steps`` repetitions of a step drawn (with ``self.np_random``) from ``steps``
    (one step by default; the budget holds for the run). The agent acts at decision points: before the
    step's first kernel, then before the first kernel that starts at least ``decision_latencies``
    switching latencies after the previous decision point or after a pending change took effect (every
    kernel with ideal switching); with ``decision_fraction`` an action holds, re-issued at each decision
    point, until that share of the run's auto time has passed. A request takes effect one switching latency
    later (drawn from the profile's spread when ``latency_noise``), at the first kernel that starts after;
    the controller holds one request at a time; each change stalls the GPU. Disturbances (duration noise,
    drift, step jitter, latency spread: :mod:`kdvfs.envs.env.dynamics`) are drawn at reset, each switchable.
    Details and the reasons for each choice: ``docs/design/environment.md``.

    ## Action Space
    ``MultiDiscrete([2, P + 2])``: (request?, plan): plan p of the P plan advisors (``plan_budgets``), the
    fitting plan or the budget's plan, i.e. which budget's latency-aware plan to follow from here; the pair
    requested is the one that plan proposes now (:mod:`kdvfs.envs.env.advice.plan_advice`; :meth:`advisor_action`
    names the values). Pairs are grid actions ``g = level * M + memory`` of the clock grid
    (:class:`kdvfs.envs.env.steps.clock_grid.ClockGrid`: C core levels, level 0 "auto" where the firmware picks the
    core clock, by M memory clocks, highest first; g = 0 is the default behaviour).
    With request = 0 the clocks are kept; with 1 the chosen pair is requested if the controller is free and
    differs from the pair in effect. A request at the first decision takes effect at once.

    ## Observation Space
    ``Box(-1000, 1000, (N,), float32)``, no kernel names or identities: the blocks of
    :class:`kdvfs.envs.env.observing.observation.ObservationSpec` in order (N is the sum of their sizes; the plans
    are :mod:`kdvfs.envs.env.advice.plan_advice`'s):

    {observation_table}

    ## Rewards
    :func:`kdvfs.envs.env.reward.reward_fn` (formula in its module): energy saved against auto minus the
    overrun penalties; an episode's return is its saving (%) minus the penalties of its final overrun.
    ``info`` has the terms, energy (J) and time (s) since the last decision; the last adds the episode summary.

    ## Starting State / Episode End
    Kernel 0 of the drawn step, clocks auto (the first action replaces them); ends after the last kernel.

    ## Arguments
    ``gym.make("KernelDVFS-v0", steps=..., gpu="h200", config=EnvConfig(...))``, or settings by name
    (``budgets=(0.02,)``), see :meth:`__init__`; ``reset(options={"step": i, "budget": b})`` picks the step
    (index or name) and budget instead of drawing them. The settings (:class:`kdvfs.envs.env.config.EnvConfig`):

    {settings_table}

    ## Version History
    * v0: initial version (observation layout version ``kdvfs.envs.env.observing.observation.OBSERVATION_VERSION``).
    """

    metadata = {"render_modes": []}  # noqa: RUF012 (Gymnasium's class attribute)

    def __init__(self, steps: Sequence[StepData] | None = None, gpu: GpuProfile | str = "h200",
                 config: EnvConfig | None = None, render_mode: str | None = None,
                 executed: Sequence[Sequence[StepData]] | None = None, **settings: Any) -> None:
        """
        Args:
            steps: the training steps episodes are drawn from, all built on the config's clock grid; None: one
                small generated step on ``gpu`` (:func:`default_step`).
            executed: per step, the steps the GPU may execute instead (each on the step's kernels,
                :meth:`StepData.executed_as`; :mod:`kdvfs.envs.env.steps.shape_pairs`): each episode executes one
                drawn from its step's list (an empty list: the step itself); None: every step executes as
                observed.
            gpu: the GPU profile (or its name) the steps were priced on; gives the switching defaults.
            config: the environment's settings; None: :class:`~kdvfs.envs.env.config.EnvConfig`'s defaults.
            render_mode: must be None (nothing to render).
            **settings: fields of :class:`~kdvfs.envs.env.config.EnvConfig` that replace the config's.
        """
        if render_mode is not None:
            raise KdvfsError(f"render_mode {render_mode!r} is not supported (it renders nothing)")
        self.config = (config if config is not None else EnvConfig()).replace(**settings)
        self.profile = gpu if isinstance(gpu, GpuProfile) else load_profile(gpu)
        self.grid = self.config.grid(self.profile)
        self.steps = list(steps) if steps else [default_step(self.profile, self.grid)]
        if any(step.grid != self.grid for step in self.steps):
            raise KdvfsError("steps must be built with the same clock grid, the config's (core_fractions, memory_mhz)")
        self._memories = len(self.grid.memory_mhz)
        self._core_fraction = core_fractions(self.steps[0].action_costs.core_mhz)
        self.timings = timings(self.config, self.profile)
        self._runs = [step.repeated(self.config.run_steps) for step in self.steps]
        if executed is not None and len(executed) != len(self.steps):
            raise KdvfsError(f"executed has {len(executed)} lists for {len(self.steps)} steps; give one per step")
        self._variants = [[self._checked_executed(run, step) for run in runs]
                          for runs, step in zip(executed or [[] for _ in self.steps], self.steps, strict=True)]
        self.observation_spec = self.config.observation_spec(self.grid)
        self.observation_space = spaces.Box(-OBS_LIMIT, OBS_LIMIT, (self.observation_spec.size,), np.float32)
        self.action_space = spaces.MultiDiscrete([2, self.observation_spec.plan_choices])
        self.render_mode = render_mode
        self._prepare()
        self._select(0, self.config.budgets[0], 0)

    def _prepare(self) -> None:
        """Per-step and regime decision-point data, the observation buffer and its compiled layout."""
        spec = self.observation_spec
        self._prepared = [[decision_data(run, spec, timing) for run in self._runs] for timing in self.timings]
        self._obs = np.zeros(spec.size, dtype=np.float32)
        self._layouts = [layout(spec, run.kernels) for run in self._runs]
        self._landings: Landings | None = None
        self._landings_for: tuple[int, int] | None = None
        self._advisor_index = advisor_index(spec)
        slots = spec.advisor_slots()
        self._plan_slots, self._budget_slot = slots["plans"], slots["budget_plan"].start
        self._advice = np.zeros(spec.advisors, dtype=np.int64)

    def _select(self, index: int, budget: float, regime: int) -> None:
        """Start an episode on step ``index``'s run with ``budget`` under switching regime ``regime``: clocks
        auto, nothing spent, no noise."""
        self._index, self._data, self.budget = index, self._runs[index], budget
        self._executed = self._data
        self._layout, self._cumulative_s = self._layouts[index], self._data.cumulative[:, 0, :]
        self.timing = self.timings[regime]
        self.latency_s, self.latency_std_s, self.stall_s = self.timing.switching
        self.decision_interval_s = self.timing.decision_interval_s
        self._static, self._plans = self._prepared[regime][index]
        if (index, regime) != self._landings_for:  # kept while episodes run the same step and regime
            self._landings = Landings(self._data, self._plans, self.latency_s, self.latency_std_s,
                                      self.decision_interval_s)
            self._landings_for = (index, regime)
            self._sizes = np.array([self._data.kernels, self._plans.pairs.shape[1], self._plan_slots.start,
                                    self._plan_slots.stop, self._budget_slot], dtype=np.int64)
        plans = self._plans
        assert self._landings is not None
        self._observation_tables = (
            self._obs, self._advice, self._static, self._layout, self._advisor_index, self._cumulative_s,
            self._landings.rows, plans.pairs, plans.rest_pct, plans.joinable, plans.next_change, plans.speeds_up,
            self._sizes, self._data.auto_time_s, self.latency_s, self.stall_s)
        """:func:`~kdvfs.envs.env.observing.live_tables.observe_at`'s leading arguments for the episode's step and
        regime."""
        self._budget_plan = plan_for_budget(self.observation_spec.plan_budgets, budget)
        self._kernels = self._data.kernels
        self._auto_time_s, self._auto_energy_j = self._data.auto_time_s, self._data.auto_energy_j
        self._reference = Reference(self._auto_energy_j, self._auto_time_s, budget)
        self.disturbances = Disturbances(None, None, None, None, self.latency_s)
        self._columns = {}
        self._k, self._in_effect, self._pending = 0, 0, -1
        self._requested_at_s = self._effective_at_s = 0.0
        self._last_latency_ratio = 1.0
        self._now_s = self._elapsed_s = self._auto_elapsed_s = self._model_elapsed_s = 0.0
        self._energy_j = self._auto_energy_so_far_j = 0.0
        self._switches = self._requests = 0
        self.applied = np.zeros(self._kernels, dtype=np.int64)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Array, dict[str, Any]]:
        """Start an episode: the step (``options["step"]``: index or name; else drawn), the budget
        (``options["budget"]``, a fraction; else drawn from ``budgets``), the switching regime and the
        disturbances. ``options["executed"]``: the GPU executes this step instead (a :class:`StepData` mapped
        onto the episode's step, :meth:`StepData.executed_as`), while the observations stay the episode's
        step's: a controller that expected one step and meets another. Returns the first observation and
        ``{"step": name, "budget": budget}``."""
        super().reset(seed=seed)
        options, budgets = options or {}, self.config.budgets
        names = [s.name for s in self.steps]
        index = step_index(names, options["step"]) if "step" in options else int(self.np_random.integers(len(names)))
        budget = float(options.get("budget", budgets[int(self.np_random.integers(len(budgets)))]))
        self._select(index, budget, regime_index(self.config.latency_scales, options, self.np_random))
        step = self.steps[index]
        if "executed" in options:
            self._executed = self._checked_executed(options["executed"], step)
        elif self._variants[index]:
            self._executed = self._variants[index][int(self.np_random.integers(len(self._variants[index])))]
        self.disturbances = draw(self.np_random, self.timing.disturbances, step.kernels, self.config.run_steps,
                                 step.auto_time_s)
        return self._observe(), {"step": self._data.name, "budget": budget}

    def _checked_executed(self, executed: StepData, step: StepData) -> StepData:
        """The run of ``executed`` (``reset``'s ``options["executed"]``), checked against the episode's ``step``."""
        if not isinstance(executed, StepData) or executed.kernels != step.kernels or executed.grid != step.grid:
            raise KdvfsError("options['executed'] must be a StepData on the env's grid with the step's kernels "
                             "(StepData.executed_as)")
        return executed.repeated(self.config.run_steps)

    def step(self, action: Array) -> tuple[Array, float, bool, bool, dict[str, Any]]:
        """Act at this decision point and run to the next one (see the class docstring); returns the
        observation, the reward, whether the run ended, False (never truncated) and ``info``.

        Raises:
            gymnasium.error.ResetNeeded: the run is over.
        """
        if self._k >= self._kernels:
            raise gym.error.ResetNeeded("the step is over; call reset()")
        before = self._totals()
        hold_until_s = self._now_s + self.config.decision_fraction * self._auto_time_s
        while True:
            self._request(action)
            self._advance(self._now_s + self.decision_interval_s)
            if self._k == self._kernels or self._now_s >= hold_until_s - EPS:
                break
            self._refresh()  # the advisors' proposals here, for the standing order
        after = self._totals()
        terminated = self._k == self._kernels
        reward, reward_info = reward_fn(before, after, self._reference, self.config, terminated)
        info: dict[str, Any] = {**reward_info, "energy_j": after.energy_j - before.energy_j,
                                "time_s": after.elapsed_s - before.elapsed_s}
        if terminated:
            info.update(self.episode_summary())
        return self._observe(), reward, terminated, False, info

    def _request(self, action: Array) -> None:
        """Act on ``action``: at the first decision its pair is in effect from the start; later a request is
        issued if the controller is free and the pair differs from the one in effect."""
        target = self.target_pair(action)
        if self._k == 0 and action[0]:
            self._in_effect = target
        elif action[0] and self._pending < 0 and target != self._in_effect:
            self._pending, self._requested_at_s = target, self._now_s
            self._effective_at_s = self._now_s + self.disturbances.latency(self._requests)
            self._requests += 1

    def target_pair(self, action: Array) -> int:
        """The grid pair ``action``'s clocks part names at this decision point (an advisor's proposal now)."""
        return int(target_pair_of(int(action[1]), self._advice, self._sizes))

    @property
    def static_rows(self) -> Array:
        """(K + 1, ``observation_spec.static_size``) float32, read-only: the static part of the observation at
        each decision point of the episode's run."""
        return self._static

    def advisor_action(self, group: str, index: int = 0) -> int:
        """The plan part of the action following plan advisor ``index`` of ``group`` (``plans``,
        ``fitting_plan`` or ``budget_plan``; the window advisors are observed, not actions: a
        :class:`KdvfsError`)."""
        if group == "windows" or group not in self.observation_spec.advisor_slots():
            raise KdvfsError(f"advisor group {group!r} is not an action; the actions follow plans, the fitting "
                             "plan or the budget's plan")
        return self.observation_spec.advisor_slots()[group].start + index - self._plan_slots.start

    @property
    def clocks(self) -> tuple[int, int, int]:
        """(current kernel, grid action in effect, grid action pending or -1)."""
        return self._k, self._in_effect, self._pending

    @property
    def advice(self) -> Array:
        """Each advisor's pair at this decision point, in action order (``ObservationSpec.advisor_slots``):
        windows (1x, 2x, 4x, rest of step), plans (by budget), the fitting plan, the budget's plan."""
        return self._advice.copy()

    def episode_summary(self) -> dict[str, Any]:
        """Energy saved and slowdown against auto (%, with this episode's noise), overrun, switches, step."""
        return {"energy_saved_pct": 100.0 * (1.0 - self._energy_j / self._auto_energy_so_far_j),
                "slowdown_pct": 100.0 * (self._elapsed_s / self._auto_elapsed_s - 1.0),
                "overrun_pct": overrun_pct(self._totals(), self._reference), "switches": self._switches,
                "budget_pct": 100.0 * self.budget, "step": self._data.name}

    def _observe(self) -> Array:
        self._refresh()
        return self._obs.copy()

    def _refresh(self) -> None:
        """Write the observation (and the advisors' pairs) of the current decision point into the buffer: the
        observation (:func:`~kdvfs.envs.env.observing.live_tables.observe_at`) of :meth:`live_state`."""
        state = self.live_state()
        assert self._landings is not None
        self._landings.of(state.in_effect)  # the row of the pair in effect, computed on first use
        k = observe_at(*self._observation_tables, self.budget, self._budget_plan, *state)
        self._obs[: self.observation_spec.static_size] = self._static[k]

    def live_state(self) -> LiveState:
        """The env's decision point as a controller measures it (:class:`~kdvfs.envs.env.observing.live.LiveState`): the
        kernel, the clocks in effect and pending, the request's age, the elapsed time over the drift's scale
        (model timeline), the prediction's auto time and its time at the clocks run for the kernels passed (not
        the executed step's, which no controller knows), the last change's latency ratio and the drift."""
        k, kernels = self._k, self._kernels
        drift_pct = self.disturbances.auto_drift_pct(min(k, kernels - 1))
        return LiveState(k, self._in_effect, self._pending,
                         self._now_s - self._requested_at_s if self._pending >= 0 else 0.0,
                         self._elapsed_s / (1.0 + drift_pct / 100.0), float(self._cumulative_s[min(k, kernels), 0]),
                         self._last_latency_ratio, drift_pct, self._model_elapsed_s)

    def live_tables(self) -> LiveTables:
        """The arrays a live decision reads at the last :meth:`reset`'s step and regime, every pair's landings
        and proposal changes computed now (a controller calls it once, so that no decision does that work);
        valid while episodes run them."""
        assert self._landings is not None
        landings, offsets, kernels = self._landings.table()
        advice = self._plans
        return LiveTables(self._obs, self._advice, self._static, self._layout, self._advisor_index,
                          self._cumulative_s, landings, advice.pairs, advice.rest_pct, advice.joinable,
                          advice.next_change, advice.speeds_up, offsets, kernels, self._sizes, self._auto_time_s,
                          self.latency_s, self.stall_s)

    @property
    def selection(self) -> tuple[int, int]:
        """The episode's step index and switching regime (:meth:`live_tables` hold theirs)."""
        assert self._landings_for is not None
        return self._landings_for

    @property
    def budget_plan(self) -> int:
        """The plan of the episode's budget (the budget plan advisor's; -1: none fits)."""
        return self._budget_plan


# The docstring's tables are rendered from the observation spec's blocks and the settings' fields.
KernelDVFSEnv.__doc__ = (KernelDVFSEnv.__doc__ or "").replace(
    "{observation_table}", textwrap.indent(observation_table(), "    ").lstrip()).replace(
    "{settings_table}", textwrap.indent(settings_table(), "    ").lstrip())
