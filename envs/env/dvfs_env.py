"""``KernelDVFS-v0``: choose GPU clocks kernel by kernel through one training step (a Gymnasium env).

Execution follows :mod:`kdvfs.envs.model.schedule` (a kernel runs at the clocks in effect when it starts, a change
stalls the GPU for ``stall_s``, the step starts with its first clocks in effect), with requests issued
online: a request made before kernel k takes effect one switching latency later, at the first kernel that
starts after it, and the controller holds one request at a time. The clocks that ran (:attr:`applied`)
priced with :func:`kdvfs.envs.model.schedule.replay` give exactly the episode's time and energy.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from kdvfs.envs.common.errors import KdvfsError
from kdvfs.envs.env.clock_grid import DEFAULT_CORE_FRACTIONS, ClockGrid
from kdvfs.envs.env.observation import (
    ADVISOR_FEATURES,
    OBS_LIMIT,
    REMAINING_LATENCIES_CAP,
    ObservationSpec,
    advisor_index,
    static_observations,
    window_bounds,
)
from kdvfs.envs.env.plan_advice import EPS, PlanAdvice, fitting_plan, landing_kernels, plan_advice, plan_for_budget
from kdvfs.envs.env.step_data import StepData
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile
from kdvfs.envs.model.cost_model import Array
from kdvfs.envs.synthetic.generator import generate_transformer_trace, load_workload

ENV_ID = "KernelDVFS-v0"
_STATIC_CACHE: weakref.WeakKeyDictionary[StepData, dict[tuple[ObservationSpec, float, float, float],
                                                         tuple[Array, PlanAdvice]]] = weakref.WeakKeyDictionary()
"""Decision-point observations and plan advice per step, shared by the envs of one process (read-only)."""


def default_step(profile: GpuProfile) -> StepData:
    """A small step for a bare ``gym.make(ENV_ID)``: one GPT-3-XL-shaped layer, batch 1, on ``profile``."""
    config = replace(load_workload("gpt3xl"), name="gpt3xl-1layer-b1", layers=1, batch=1)
    grid = ClockGrid.for_profile(profile, DEFAULT_CORE_FRACTIONS)
    return StepData.build(config.name, generate_transformer_trace(config, profile), profile, grid)


class KernelDVFSEnv(gym.Env[np.ndarray, np.ndarray]):
    """Pick the core and memory clocks for the kernels of a training step, saving energy within a time budget.

    ## Description
    An episode is one training step of a trace drawn (with ``self.np_random``) from ``steps``. The agent acts
    at decision points: before the step's first kernel, then before the first kernel that starts at least
    ``decision_latencies`` switching latencies after the previous decision point or after a pending change
    took effect (every kernel with ideal switching). A request takes effect one switching latency later
    (drawn from the profile's spread when ``latency_noise``), at the first kernel that starts after that;
    the controller holds one request at a time; each change stalls the GPU. Kernel times and energies get
    seeded multiplicative noise. Details and the reasons for each choice: ``docs/environment.md``.

    ## Action Space
    ``MultiDiscrete([2, G + W + 1 + P + 2])``: (request?, clocks). Clocks ``g < G`` are pair ``g = level * M
    + memory`` of the clock grid (:class:`kdvfs.envs.env.clock_grid.ClockGrid`: C core levels, level 0 "auto" where
    the firmware picks the core clock, by M memory clocks, highest first; g = 0 is the default behaviour);
    ``G + w`` is the pair advisor w proposes now (W + 1 window advisors, then P plan advisors, the fitting
    plan and the budget's plan; below). With request = 0 the clocks are kept; with 1 the
    chosen pair is requested if the controller is free and differs from the pair in effect. A request at
    the first decision takes effect at once (the step starts with it).

    ## Observation Space
    ``Box(-1000, 1000, (N,), float32)``, layout :class:`kdvfs.envs.env.observation.ObservationSpec`: features of the
    next kernels (log duration, SM/DRAM/tensor utilisation, category one-hot; no identities); for windows
    of 1x, 2x, 4x the latency starting where a request made now would take effect, and for the rest of the
    step from there, every pair's slowdown and energy saving against auto (%); whether that point lies
    beyond the step; the pairs in effect and pending (one-hot core level and memory clock) and the expected
    time until the pending change (in latencies); whether the controller is free and whether a choice
    applies at once; the budget (%), the share of it used so far (slowdown relative to auto's progress), the
    slowdown still affordable over the rest (%), the progress and the remaining step in latencies; and for
    each window advisor (the pair saving the most over the window among those whose slowdown there fits
    the affordable slowdown, auto always fitting) its saving and slowdown over its window and over the
    rest, and whether it is the pair in effect; for each plan advisor (:mod:`kdvfs.envs.env.plan_advice`: the
    latency-aware optimum of the step for each of ``plan_budgets``, proposing the pair it runs where a
    request made now takes effect) its saving and slowdown from there to the step's end and whether its
    pair is in effect; for the fitting plan (the plan saving the most among those fitting what is still
    affordable there) and the budget's plan (the largest plan budget within the episode's) the same and
    whether there is one.

    ## Rewards
    Per decision: ``100 * (E_auto - E) / E_auto_step`` over the kernels run since the last decision (energy
    saved against auto, % of the step's auto energy; E includes stalls) minus ``overrun_penalty`` times the
    increase of ``max(0, 100 * (T - (1 + budget) * T_auto) / T_auto_step)`` (T, T_auto: elapsed time and
    auto's time over the same kernels). The sum over an episode is the step's energy saving (%) minus
    ``overrun_penalty`` x its overrun of the budget (%). ``info`` carries both terms with the energy (J) and
    time (s) since the last decision; the last ``info`` adds ``energy_saved_pct``, ``slowdown_pct``,
    ``overrun_pct``, ``switches``, ``budget_pct`` and ``step``.

    ## Starting State
    Kernel 0 of the drawn step, clocks auto (the first action replaces them), nothing pending or spent.

    ## Episode End
    Terminates after the step's last kernel; never truncated.

    ## Arguments
    ``gym.make("KernelDVFS-v0", steps=..., gpu="h200", ...)``, see :meth:`__init__`. ``reset(options=
    {"step": i, "budget": b})`` picks the step (index or name) and budget instead of drawing them.

    ## Version History
    * v0: initial version (observation layout version ``kdvfs.envs.env.observation.OBSERVATION_VERSION``).
    """

    metadata = {"render_modes": []}  # noqa: RUF012 (Gymnasium's class attribute)

    def __init__(self, steps: Sequence[StepData] | None = None, gpu: GpuProfile | str = "h200",
                 budgets: Sequence[float] = (0.01,), latency_s: float | None = None,
                 latency_std_s: float | None = None, stall_s: float | None = None, latency_noise: bool = True,
                 duration_noise: float = 0.02, overrun_penalty: float = 20.0, decision_latencies: float = 0.25,
                 next_kernels: int = 2, window_latencies: Sequence[float] = (1.0, 2.0, 4.0),
                 plan_budgets: Sequence[float] = (), render_mode: str | None = None) -> None:
        """
        Args:
            steps: the training steps episodes are drawn from, all built with one clock grid; None: one small
                generated step on ``gpu`` (:func:`default_step`).
            gpu: the GPU profile (or its name) the steps were priced on; gives the latency and stall defaults.
            budgets: slowdown budgets (fractions, 0.01 = 1%) drawn per episode.
            latency_s: mean switching latency (s); None: the profile's. 0 = ideal switching.
            latency_std_s: spread of the latency (s); None: the profile's, or 0 with ideal switching.
            stall_s: GPU stall per clock change (s); None: the profile's, or 0 with ideal switching.
            latency_noise: draw each request's latency from N(mean, spread) (clipped at 0); else the mean.
            duration_noise: sigma of log-normal multiplicative noise on each kernel's time and energy, per
                episode; 0 disables it.
            overrun_penalty: reward lost per percent of step time beyond the budget.
            decision_latencies: time between decision points in switching latencies (with ideal switching,
                every kernel is a decision point).
            next_kernels: how many coming kernels' features the observation shows.
            window_latencies: look-ahead window lengths in switching latencies.
            plan_budgets: slowdown budgets (fractions) of the plan advisors (:mod:`kdvfs.envs.env.plan_advice`); empty:
                none.
            render_mode: must be None (nothing to render).
        """
        profile = gpu if isinstance(gpu, GpuProfile) else load_profile(gpu)
        self.steps = list(steps) if steps else [default_step(profile)]
        grid = self.steps[0].grid
        if any(step.grid != grid for step in self.steps):
            raise KdvfsError("every step given to KernelDVFS-v0 must be built with the same clock grid")
        if not budgets or min(budgets) < 0:
            raise KdvfsError(f"budgets {list(budgets)} must be a non-empty list of fractions >= 0")
        if render_mode is not None:
            raise KdvfsError(f"render_mode {render_mode!r} is not supported (it renders nothing)")
        if decision_latencies < 0 or next_kernels < 1 or not window_latencies or min(window_latencies) <= 0:
            raise KdvfsError("need decision_latencies >= 0, next_kernels >= 1 and positive window_latencies")
        self.profile, self.grid, self.budgets = profile, grid, tuple(float(b) for b in budgets)
        self._pairs, self._memories = grid.size, len(grid.memory_mhz)
        self.latency_s = profile.switching.latency_mean_s if latency_s is None else float(latency_s)
        default_std = profile.switching.latency_std_s if self.latency_s > 0 else 0.0
        self.latency_std_s = default_std if latency_std_s is None else float(latency_std_s)
        default_stall = profile.cost_param("switch_stall_s") if self.latency_s > 0 else 0.0
        self.stall_s = default_stall if stall_s is None else float(stall_s)
        self.latency_noise, self.duration_noise, self.overrun_penalty = latency_noise, duration_noise, overrun_penalty
        self.decision_interval_s = float(decision_latencies) * self.latency_s
        self.observation_spec = ObservationSpec(grid, next_kernels, tuple(float(w) for w in window_latencies),
                                                tuple(float(b) for b in plan_budgets))
        self.observation_space = spaces.Box(-OBS_LIMIT, OBS_LIMIT, (self.observation_spec.size,), np.float32)
        self.action_space = spaces.MultiDiscrete([2, grid.size + self.observation_spec.advisors])
        self.render_mode = render_mode
        self._prepare()
        self._select(0, self.budgets[0])

    def _prepare(self) -> None:
        """Per-step decision-point data, the observation buffer and the views written at every decision."""
        self._static, self._plans = zip(*(self._static_observations(s) for s in self.steps), strict=True)
        self._offsets = self.observation_spec.offsets()
        self._obs = np.zeros(self.observation_spec.size, dtype=np.float32)
        self._views = self._observation_views()
        windows = len(self.observation_spec.window_latencies) + 1
        self._advisor_index = advisor_index(windows, self._pairs)
        self._advice = np.zeros(self.observation_spec.advisors, dtype=np.int64)
        self._fits = np.zeros((windows, self._pairs), dtype=bool)

    def _observation_views(self) -> dict[str, Array]:
        """Views into the observation buffer of the blocks written at every decision."""
        obs, offsets, size = self._obs, self._offsets, self.grid.size
        start, end = offsets["window_slowdown_then_saving_pct"], offsets["window_beyond_step"]
        middle = (start + end) // 2
        plans = offsets["plans_rest_saving_then_slowdown_pct"]
        return {"slowdowns": obs[start:middle].reshape(-1, size), "savings": obs[middle:end].reshape(-1, size),
                "windows_flat": obs[start:end],
                "advisors": obs[offsets["advisors"]:plans].reshape(len(ADVISOR_FEATURES), -1),
                "plans_rest": obs[plans:offsets["plans_in_effect"]],
                "plans_in_effect": obs[offsets["plans_in_effect"]:offsets["fitting_plan"]],
                "fitting_plan": obs[offsets["fitting_plan"]:offsets["budget_plan"]],
                "budget_plan": obs[offsets["budget_plan"]:]}

    def _static_observations(self, step: StepData) -> tuple[Array, PlanAdvice]:
        """The decision-point part of every observation of ``step`` and its plan advice (segments at least a
        latency plus its spread long), computed once per process."""
        key = (self.observation_spec, self.latency_s, self.latency_std_s, self.stall_s)
        cached = _STATIC_CACHE.setdefault(step, {})
        if key not in cached:
            effect = window_bounds(step.cumulative[:, 0, 0], self.latency_s, (1.0,))[:, 0]
            plans = plan_advice(step, self.observation_spec.plan_budgets, effect,
                                self.latency_s + self.latency_std_s, self.stall_s)
            cached[key] = (static_observations(step, self.observation_spec, self.latency_s), plans)
        return cached[key]

    def _select(self, index: int, budget: float) -> None:
        """Start an episode on step ``index`` with ``budget``: clocks auto, nothing spent, no noise."""
        self._index, self._data, self.budget = index, self.steps[index], budget
        self._budget_plan = plan_for_budget(self.observation_spec.plan_budgets, budget)
        self._kernels = self._data.kernels
        self._auto_time_s, self._auto_energy_j = self._data.auto_time_s, self._data.auto_energy_j
        self._noise: Array | None = None
        self._columns: dict[int, tuple[Array, Array]] = {}
        self._k, self._in_effect, self._pending = 0, 0, -1
        self._requested_at_s = self._effective_at_s = 0.0
        self._now_s = self._elapsed_s = self._auto_elapsed_s = 0.0
        self._energy_j = self._auto_energy_so_far_j = self._overrun_pct = 0.0
        self._switches = 0
        self.applied = np.zeros(self._kernels, dtype=np.int64)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Array, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        drawn = "step" not in options
        index = int(self.np_random.integers(len(self.steps))) if drawn else self._step_index(options["step"])
        budget = float(options.get("budget", self.budgets[int(self.np_random.integers(len(self.budgets)))]))
        self._select(index, budget)
        if self.duration_noise > 0:
            self._noise = np.exp(self.np_random.normal(0.0, self.duration_noise, self._kernels))
        return self._observe(), {"step": self._data.name, "budget": budget}

    def _step_index(self, step: int | str) -> int:
        names = [s.name for s in self.steps]
        if isinstance(step, str):
            if step not in names:
                raise KdvfsError(f"no step named {step!r}; have {names}")
            return names.index(step)
        if not 0 <= int(step) < len(self.steps):
            raise KdvfsError(f"step index {step} out of range 0..{len(self.steps) - 1}")
        return int(step)

    def _latency(self) -> float:
        if self.latency_noise and self.latency_std_s > 0:
            return max(0.0, float(self.np_random.normal(self.latency_s, self.latency_std_s)))
        return self.latency_s

    def step(self, action: Array) -> tuple[Array, float, bool, bool, dict[str, Any]]:
        if self._k >= self._kernels:
            raise gym.error.ResetNeeded("the step is over; call reset()")
        target = int(action[1]) if action[1] < self._pairs else int(self._advice[action[1] - self._pairs])
        if self._k == 0 and action[0]:
            self._in_effect = target
        elif action[0] and self._pending < 0 and target != self._in_effect:
            self._pending, self._requested_at_s = target, self._now_s
            self._effective_at_s = self._now_s + self._latency()
        before = (self._energy_j, self._auto_energy_so_far_j, self._elapsed_s, self._overrun_pct)
        self._advance(self._now_s + self.decision_interval_s)
        excess = self._elapsed_s - self._auto_elapsed_s - self.budget * self._auto_time_s
        self._overrun_pct = max(0.0, 100.0 * excess / self._auto_time_s)
        energy_j, auto_energy_j = self._energy_j - before[0], self._auto_energy_so_far_j - before[1]
        reward_energy = 100.0 * (auto_energy_j - energy_j) / self._auto_energy_j
        reward_time = -self.overrun_penalty * (self._overrun_pct - before[3])
        terminated = self._k == self._kernels
        info: dict[str, Any] = {"reward_energy": reward_energy, "reward_time": reward_time, "energy_j": energy_j,
                                "time_s": self._elapsed_s - before[2]}
        if terminated:
            info.update(self.episode_summary())
        return self._observe(), reward_energy + reward_time, terminated, False, info

    def _advance(self, deadline_s: float) -> None:
        """Run kernels up to the next decision point: the first kernel starting at or after ``deadline_s``
        (at least one kernel); a pending change takes effect at the first kernel starting at or after its
        effective time, with its stall."""
        ran = False
        while self._k < self._kernels:
            if self._pending >= 0 and self._effective_at_s <= self._now_s + EPS:
                self._apply_pending()
                if ran:
                    return
            if ran and self._now_s >= deadline_s - EPS:
                return
            limit_s = deadline_s if self._pending < 0 else min(deadline_s, self._effective_at_s)
            self._run_until(limit_s)
            ran = True

    def _apply_pending(self) -> None:
        self._in_effect, self._pending = self._pending, -1
        self._switches += 1
        self._elapsed_s += self.stall_s
        self._energy_j += self.stall_s * float(self._data.idle_power_w[self._in_effect])

    def _run_until(self, limit_s: float) -> None:
        """Run the kernels from the current one (at least it) up to the first starting at or after ``limit_s``,
        at the clocks in effect."""
        k, g = self._k, self._in_effect
        times, energies = self._column(g)
        auto_times, auto_energies = self._column(0)
        end = int(times.searchsorted(times[k] + (limit_s - self._now_s) - EPS, side="left"))
        end = min(max(end, k + 1), self._kernels)
        time_s = float(times[end] - times[k])
        self._now_s += time_s
        self._elapsed_s += time_s
        self._energy_j += float(energies[end] - energies[k])
        self._auto_elapsed_s += float(auto_times[end] - auto_times[k])
        self._auto_energy_so_far_j += float(auto_energies[end] - auto_energies[k])
        self.applied[k:end] = self._data.actions[g]
        self._k = end

    def _column(self, action: int) -> tuple[Array, Array]:
        """Cumulative time and energy at ``action`` with this episode's noise (computed on first use)."""
        column = self._columns.get(action)
        if column is None:
            column = self._columns[action] = self._data.cumulative_of(action, self._noise)
        return column

    @property
    def clocks(self) -> tuple[int, int, int]:
        """(current kernel, grid action in effect, grid action pending or -1)."""
        return self._k, self._in_effect, self._pending

    @property
    def advice(self) -> Array:
        """Each advisor's pair at this decision point, in action order: windows (1x, 2x, 4x, rest of step), plans
        (by budget), the fitting plan, the budget's plan."""
        return self._advice.copy()

    def episode_summary(self) -> dict[str, Any]:
        """Energy saved and slowdown against auto (%, with this episode's noise), overrun, switches, step."""
        return {"energy_saved_pct": 100.0 * (1.0 - self._energy_j / self._auto_energy_so_far_j),
                "slowdown_pct": 100.0 * (self._elapsed_s / self._auto_elapsed_s - 1.0),
                "overrun_pct": self._overrun_pct, "switches": self._switches, "budget_pct": 100.0 * self.budget,
                "step": self._data.name}

    def _observe(self) -> Array:
        obs, offsets = self._obs, self._offsets
        static = self._static[self._index][self._k]
        obs[: len(static)] = static
        self._observe_clocks(obs, offsets["clocks_in_effect"], offsets["controller"])
        self._observe_affordable(self._observe_budget(obs, offsets["budget"]))
        return obs.copy()

    def _observe_affordable(self, affordable: float) -> None:
        """Each advisor's pick: the pair saving the most over its window among those whose slowdown there fits
        the affordable slowdown (at most 0 when none is left: auto always fits), with what it saves and costs."""
        fits = self._fits
        np.less_equal(self._views["slowdowns"], max(affordable, 0.0), out=fits)
        windows = len(fits)
        best = np.where(fits, self._views["savings"], -np.inf).argmax(axis=1)
        self._advice[:windows] = best
        advisors = self._views["advisors"]
        advisors[:4] = self._views["windows_flat"].take(self._advisor_index + best)
        advisors[4] = best == self._in_effect
        self._observe_plans(windows)

    def _observe_plans(self, windows: int) -> None:
        """Each plan advisor's pair where a request made now would take effect at the clocks in effect, its
        saving and slowdown from there, whether it is in effect; the fitting plan (auto if none fits): the
        one saving the most among those whose slowdown from there fits what is still affordable there, once
        the kernels until then have run at the clocks in effect; and the plan for the episode's budget (the
        largest plan budget within it; auto if none is)."""
        advice, effect, next_effect = self._plans[self._index], *self._effects_in_effect()
        pairs = advice.advice_pairs(effect, next_effect)
        self._advice[windows:windows + len(pairs)] = pairs
        np.equal(pairs, self._in_effect, out=self._views["plans_in_effect"], casting="unsafe")
        rest = self._views["plans_rest"]
        rest[:] = advice.rest_pct[effect]
        followable = self._views["plans_in_effect"].astype(bool) | advice.joinable[effect]
        chosen = fitting_plan(rest, self._affordable_from_effect_pct(effect), followable)
        self._observe_plan_advisor(-2, self._views["fitting_plan"], chosen, pairs, rest)
        self._observe_plan_advisor(-1, self._views["budget_plan"], self._budget_plan, pairs, rest)

    def _observe_plan_advisor(self, slot: int, view: Array, plan: int, pairs: Array, rest: Array) -> None:
        """Advisor ``slot`` proposes plan ``plan``'s pair (auto if -1); ``view`` gets its features."""
        if plan < 0:
            self._advice[slot] = 0
            view[:] = (0.0, 0.0, float(self._in_effect == 0), 0.0)
        else:
            self._advice[slot] = pairs[plan]
            view[:] = (rest[plan], rest[len(pairs) + plan], float(pairs[plan] == self._in_effect), 1.0)

    def _observe_clocks(self, obs: Array, start: int, controller: int) -> None:
        memories = self._memories
        levels = self._pairs // memories
        width = levels + memories
        obs[start:controller] = 0.0
        obs[start + self._in_effect // memories] = 1.0
        obs[start + levels + self._in_effect % memories] = 1.0
        latency = self.latency_s
        if self._pending >= 0:
            obs[start + width + self._pending // memories] = 1.0
            obs[start + width + levels + self._pending % memories] = 1.0
            left = self._requested_at_s + latency - self._now_s
            obs[controller] = max(0.0, left) / latency if latency > 0 else 0.0
        else:
            obs[controller] = 0.0
        obs[controller + 1] = 1.0 if self._pending < 0 else 0.0
        obs[controller + 2] = 1.0 if self._k == 0 or latency <= 0 else 0.0

    def _effects_in_effect(self) -> tuple[int, int]:
        """:func:`kdvfs.envs.env.plan_advice.landing_kernels` on the timeline of the clocks in effect (mean times)."""
        times = self._data.cumulative_of(self._in_effect)[0]
        return landing_kernels(times, self._k, self.latency_s, self.latency_std_s, self.decision_interval_s)

    def _affordable_from_effect_pct(self, effect: int) -> float:
        """Slowdown (%) still affordable from kernel ``effect`` to the step's end, if the kernels until then
        run at the clocks in effect (mean values)."""
        cumulative, k = self._data.cumulative, self._k
        total, auto_at_effect = self._auto_time_s, float(cumulative[effect, 0, 0])
        committed_s = float(cumulative[effect, 0, self._in_effect] - cumulative[k, 0, self._in_effect])
        used_s = self._elapsed_s + committed_s - auto_at_effect
        return 100.0 * (self.budget * total - used_s) / max(total - auto_at_effect, 1e-6 * total)

    def _observe_budget(self, obs: Array, start: int) -> float:
        """Writes the budget block; returns the slowdown still affordable over the rest of the step (%)."""
        total = self._auto_time_s
        expected = float(self._data.cumulative[min(self._k, self._kernels), 0, 0])
        used_s = self._elapsed_s - expected
        remaining = total - expected
        obs[start] = 100.0 * self.budget
        obs[start + 1] = min(OBS_LIMIT, max(-OBS_LIMIT, used_s / (max(self.budget, 1e-3) * total)))
        affordable = 100.0 * (self.budget * total - used_s) / max(remaining, 1e-6 * total)
        obs[start + 2] = min(OBS_LIMIT, max(-OBS_LIMIT, affordable))
        obs[start + 3] = expected / total
        latencies = remaining / self.latency_s if self.latency_s > 0 else REMAINING_LATENCIES_CAP
        obs[start + 4] = min(latencies, REMAINING_LATENCIES_CAP) / REMAINING_LATENCIES_CAP
        return affordable
