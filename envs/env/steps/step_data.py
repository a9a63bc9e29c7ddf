"""One training step prepared for the environment, built once so that stepping only indexes arrays.

:class:`StepData` holds, for the grid actions of a :class:`~kdvfs.envs.env.steps.clock_grid.ClockGrid`, each
kernel's time and energy (idle gap before it included) from the cost model, their cumulative sums (look-ahead windows
are differences of two rows), and each kernel's observation features: log duration, SM, DRAM and tensor
utilisation and its category, never its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.errors import KdvfsError
from kdvfs.envs.env.steps.clock_grid import ClockGrid
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.cost_model import CostParams
from kdvfs.envs.model.cost_tables import build_tables
from kdvfs.envs.model.estimate import estimate_features
from kdvfs.envs.model.schedule import ActionCosts
from kdvfs.envs.model.step.align import slots
from kdvfs.envs.trace.trace import Category, Trace

CATEGORIES = tuple(Category)
KERNEL_FEATURES = ("log_duration", "sm_util", "dram_util", "tensor_util", *(f"is_{c.value}" for c in CATEGORIES))
LOG10_DURATION_CENTRE = -4.5
"""log10 of a ~30 us kernel: kernels of 1 us to 1 ms map to about -1 to 1."""


def kernel_features(trace: Trace) -> Array:
    """(K, F) float32 observation features of each kernel (see ``KERNEL_FEATURES``); missing utilisations 0."""
    utilisation = np.nan_to_num(np.stack([trace.sm_util, trace.dram_util, trace.tensor_util], axis=1), nan=0.0)
    categories = np.array([CATEGORIES.index(k.category) for k in trace.kernels])
    one_hot = np.eye(len(CATEGORIES))[categories]
    duration = np.log10(np.asarray(trace.duration_s)) - LOG10_DURATION_CENTRE
    return np.column_stack([duration, utilisation, one_hot]).astype(np.float32)


def _cumulative(time_s: Array, energy_j: Array) -> Array:
    """(K + 1, 2, G) cumulative time and energy before each kernel."""
    both = np.stack([time_s, energy_j], axis=1)
    return np.concatenate([np.zeros((1, *both.shape[1:])), np.cumsum(both, axis=0)])


@dataclass(frozen=True, eq=False)
class StepData:
    """A step's grid-action costs and kernel features. K kernels, G grid actions (g = 0 is auto). Compared
    and hashed by identity (it holds arrays).

    Attributes:
        name: the step's label (workload or variant name).
        grid: the clock actions the columns stand for.
        actions: (G,) each grid action's index into the step's full ``ActionCosts``.
        time_s: (K, G) kernel plus preceding idle gap (s) at each grid action.
        energy_j: (K, G) the same in energy (J).
        idle_power_w: (G,) power while stalled for a clock change at each grid action (W).
        features: (K, F) float32 kernel features (``KERNEL_FEATURES``).
        cumulative: (K + 1, 2, G) cumulative time (s) and energy (J) before each kernel, per grid action.
    """

    name: str
    grid: ClockGrid
    actions: Array
    time_s: Array
    energy_j: Array
    idle_power_w: Array
    features: Array
    cumulative: Array

    @classmethod
    def from_costs(cls, name: str, trace: Trace, costs: ActionCosts, grid: ClockGrid) -> StepData:
        """From a step's action costs (as a planner's ``Problem`` holds them); ``trace`` has features."""
        actions = grid.indices(costs)
        time_s, energy_j = costs.time_s[:, actions], costs.energy_j[:, actions]
        return cls(name, grid, actions, time_s, energy_j, costs.idle_power_w[actions], kernel_features(trace),
                   _cumulative(time_s, energy_j))

    @classmethod
    def build(cls, name: str, trace: Trace, profile: GpuProfile, grid: ClockGrid) -> StepData:
        """Price ``trace`` on ``profile`` with the cost model (features estimated where missing)."""
        return cls.from_costs(name, *priced(trace, profile), grid)

    @classmethod
    def executed_as(cls, expected: Trace, executed: Trace, costs: ActionCosts, grid: ClockGrid) -> StepData:
        """The step ``executed`` (its action costs ``costs``) as a controller expecting ``expected`` meets it,
        on ``expected``'s K kernels: each executed kernel's time and energy go to the kernel of ``expected`` that
        stands for it (:func:`~kdvfs.envs.model.step.align.slots`: its partner, else the partner of the nearest
        paired kernel before it, else the expected step's first kernel); an expected kernel that
        did not run costs nothing. Every action's total time and energy are the executed step's. Features
        are ``expected``'s (what the controller sees)."""
        own = cls.from_costs(executed.meta.workload, executed, costs, grid)
        slot = slots(expected, executed)
        time_s, energy_j = np.zeros((len(expected), grid.size)), np.zeros((len(expected), grid.size))
        np.add.at(time_s, slot, own.time_s)
        np.add.at(energy_j, slot, own.energy_j)
        return cls(own.name, grid, own.actions, time_s, energy_j, own.idle_power_w, kernel_features(expected),
                   _cumulative(time_s, energy_j))

    @cached_property
    def _by_action(self) -> tuple[Array, Array]:
        return np.ascontiguousarray(self.cumulative[:, 0].T), np.ascontiguousarray(self.cumulative[:, 1].T)

    def cumulative_of(self, action: int, time_factor: Array | None = None, energy_factor: Array | None = None
                      ) -> tuple[Array, Array]:
        """Cumulative time (s) and energy (J) before each kernel at grid action ``action``, each (K + 1,);
        ``time_factor`` and ``energy_factor`` (K,) multiply each kernel's time and energy (None: 1)."""
        if time_factor is None and energy_factor is None:
            return self._by_action[0][action], self._by_action[1][action]
        time_s, energy_j = np.zeros(self.kernels + 1), np.zeros(self.kernels + 1)
        column_s, column_j = self.time_s[:, action], self.energy_j[:, action]
        np.cumsum(column_s if time_factor is None else column_s * time_factor, out=time_s[1:])
        np.cumsum(column_j if energy_factor is None else column_j * energy_factor, out=energy_j[1:])
        return time_s, energy_j

    @cached_property
    def _repeats(self) -> dict[int, StepData]:
        return {1: self}

    def repeated(self, times: int) -> StepData:
        """The run of ``times`` consecutive repetitions of this step (built once per step and count)."""
        run = self._repeats.get(times)
        if run is None:
            time_s, energy_j = np.tile(self.time_s, (times, 1)), np.tile(self.energy_j, (times, 1))
            run = self._repeats[times] = StepData(self.name, self.grid, self.actions, time_s, energy_j,
                                                  self.idle_power_w, np.tile(self.features, (times, 1)),
                                                  _cumulative(time_s, energy_j))
        return run

    @cached_property
    def action_costs(self) -> ActionCosts:
        """The grid actions as planner costs (grid action 0, auto, is the default behaviour)."""
        labels = [self.grid.label(g).split(":") for g in range(self.grid.size)]
        core = np.array([np.nan if c == "auto" else float(c) for c, _ in labels])
        return ActionCosts(self.time_s, self.energy_j, core, np.array([float(m) for _, m in labels]), 0,
                           self.idle_power_w)

    @property
    def kernels(self) -> int:
        return int(self.time_s.shape[0])

    @property
    def auto_time_s(self) -> float:
        """Step time in auto mode (s)."""
        return float(self.cumulative[-1, 0, 0])

    @property
    def auto_energy_j(self) -> float:
        """Step energy in auto mode (J)."""
        return float(self.cumulative[-1, 1, 0])


def priced(trace: Trace, profile: GpuProfile) -> tuple[Trace, ActionCosts]:
    """``trace`` with its features estimated where missing, and its action costs on ``profile`` (cost model)."""
    trace = estimate_features(trace, profile)
    return trace, ActionCosts.from_tables(build_tables(trace, profile, CostParams.from_profile(profile)))


def step_index(names: list[str], step: int | str) -> int:
    """The index of ``step`` (a name or an index) among steps named ``names``; a clear error if none."""
    if isinstance(step, str):
        if step not in names:
            raise KdvfsError(f"no step named {step!r}; have {names}")
        return names.index(step)
    if not 0 <= int(step) < len(names):
        raise KdvfsError(f"step index {step} out of range 0..{len(names) - 1}")
    return int(step)
