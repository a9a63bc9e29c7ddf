"""A fake GPU for tests: the :class:`~kdvfs.runtime.device.interface.Device` interface simulated by the cost model
(:class:`FakeGpu`), the virtual clock it runs on (:class:`VirtualClock`) and its step timeline
(:class:`FakeStepTimeline`, a :class:`~kdvfs.runtime.controller.timing.gpu_timeline.StepTimeline`).

It runs training steps of one trace on a virtual clock (no sleeping), kernel by kernel as far as the code
under test looks: each kernel at the clocks in effect when it starts, priced by the step's
:class:`~kdvfs.envs.model.schedule.ActionCosts`; a clock request takes effect a switching latency after it
was made (the mean, or drawn with ``latency_std_s``) and stalls the GPU for ``stall_s`` at idle power, as
in :mod:`kdvfs.envs.model.schedule`. Disturbances: with a :class:`~kdvfs.envs.model.drift.DriftModel`
each step's kernel times and energies are scaled by that step's drift and noise factors, and with
``duration_noise`` each kernel's by its own lognormal draw (the same at every clock: the true relative
effect of a schedule stays the cost model's, :attr:`FakeStep.model_time_s`). Every device call is recorded with
its virtual time.
It is only ever used when a caller constructs it: kdvfs never falls back to it.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.drift import Drift, DriftModel
from kdvfs.envs.model.schedule import ActionCosts
from kdvfs.envs.trace.shape import StepShape
from kdvfs.runtime.controller.timing.gpu_timeline import StepEnd
from kdvfs.runtime.device.errors import NvmlPermissionError
from kdvfs.runtime.device.interface import check_clocks_mhz

NORMAL_SIGNATURE = 1000
"""Allocations a regular step of :class:`FakeStepTimeline` counts."""


class VirtualClock:
    """A clock that jumps: ``sleep_until`` moves it forward instead of waiting. Thread-safe."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s
        self._lock = threading.Lock()

    def now_s(self) -> float:
        with self._lock:
            return self._now_s

    def advance_to(self, time_s: float) -> None:
        """Move the clock to ``time_s`` (never backwards)."""
        with self._lock:
            self._now_s = max(self._now_s, time_s)

    def sleep_until(self, time_s: float, stop: threading.Event) -> bool:
        if stop.is_set():
            return False
        self.advance_to(time_s)
        return True


@dataclass(frozen=True)
class DeviceCall:
    """One call on the fake device: virtual time (s), method and arguments."""

    time_s: float
    name: str
    args: tuple[Any, ...] = ()


@dataclass
class FakeStep:
    """What one simulated step did: start and end (virtual s), energy (J), the action each kernel ran at,
    the drift and noise factors its time and energy were scaled by (1 without a drift model), and its time
    and energy with no disturbance at all (the cost model's for the clocks it ran: the truth)."""

    start_s: float
    end_s: float
    energy_j: float
    applied: Array = field(repr=False)
    time_factor: float = 1.0
    energy_factor: float = 1.0
    model_time_s: float = 0.0
    model_energy_j: float = 0.0
    kernel_start_s: Array = field(default_factory=lambda: np.zeros(0), repr=False)


@dataclass
class _Running:
    """The step being simulated: its start, factors, next kernel, time reached and totals so far."""

    costs: ActionCosts
    start_s: float
    time_factor: float
    energy_factor: float
    noise: Array
    delays_s: dict[int, float]
    applied: Array
    kernel: int = 0
    now_s: float = 0.0
    energy_j: float = 0.0
    model_time_s: float = 0.0
    model_energy_j: float = 0.0
    kernel_start_s: list[float] = field(default_factory=list)


FAKE_GPU_UUID = "GPU-fa4e0000-0000-0000-0000-000000000000"


class FakeGpu:
    """A simulated GPU running the step priced by ``costs`` (see the module docstring).

    Steps run back to back, simulated kernel by kernel as far as anyone looks (:meth:`kernel_start_s`,
    :meth:`clocks_mhz` and the energy counter simulate up to the virtual now, :meth:`run_step` to the step's
    end): a kernel runs at the clocks in effect when it starts, and a request made at virtual time t takes
    effect at the first kernel starting after t plus its latency (changes apply in the order requested).

    Args:
        costs: the step's time and energy under every action.
        profile: the GPU (name, supported clocks, default memory clock).
        latency_s, stall_s: mean switching latency and stall per change (s).
        clock: the virtual clock shared with the code under test.
        permission: what :meth:`has_clock_permission` answers.
        drift: thermal drift and step noise (default: none).
        latency_std_s: spread of each request's latency (s; normal, at least 0).
        duration_noise: sd of each kernel's lognormal time factor, drawn per kernel and step (the same at
            every clock; its energy scales with it).
        seed: seed of the latency and duration draws (separate streams: a step's duration draws do not
            depend on the requests made before it).
    """

    def __init__(self, costs: ActionCosts, profile: GpuProfile, latency_s: float, stall_s: float,
                 clock: VirtualClock, permission: bool = True, drift: DriftModel | None = None,
                 latency_std_s: float = 0.0, duration_noise: float = 0.0, seed: int = 0) -> None:
        self.index, self.name = 0, profile.model
        self.costs, self.profile, self.latency_s, self.stall_s = costs, profile, latency_s, stall_s
        self.latency_std_s, self.duration_noise = latency_std_s, duration_noise
        self.clock, self.permission = clock, permission
        self.calls: list[DeviceCall] = []
        self.steps: list[FakeStep] = []
        self.step_costs: dict[int, ActionCosts] = {}
        """Step ``i`` runs ``step_costs[i]`` where given (a step of another shape, on the same clock grid), else
        ``costs``."""
        self.delays_s: dict[tuple[int, int], float] = {}
        """Idle time inserted before kernel k of step i, ``delays_s[(i, k)]`` (e.g. a host that fell behind)."""
        self.latencies_s: list[float] = []
        self._changes: list[tuple[float, int]] = []
        self._action = costs.auto_index
        self._energy_j, self._power_w, self._end_s = 0.0, 0.0, 0.0
        self._lock = threading.RLock()
        self._drift = Drift(drift) if drift is not None else None
        self._noise_rng, self._latency_rng = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
        self._running: _Running | None = None

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append(DeviceCall(self.clock.now_s(), name, args))

    @property
    def set_calls(self) -> list[DeviceCall]:
        """Calls that change clocks."""
        return [call for call in self.calls if call.name in ("lock_clocks_mhz", "reset_clocks")]

    def uuid(self) -> str:
        return FAKE_GPU_UUID

    def supported_clocks_mhz(self) -> dict[int, tuple[int, ...]]:
        clocks = self.profile.clocks
        return {mem: tuple(clocks.core_mhz[mem]) for mem in clocks.memory_mhz}

    def clocks_mhz(self) -> tuple[float, float]:
        with self._lock:
            self._simulate(self.clock.now_s())
            action = self._action
        core, mem = self.costs.core_mhz[action], self.costs.mem_mhz[action]
        return float(self.profile.clocks.max_core_mhz if np.isnan(core) else core), float(mem)

    def power_w(self) -> float:
        return self._power_w

    def energy_j(self) -> float:
        with self._lock:
            self._simulate(self.clock.now_s())
            return self._energy_j + (0.0 if self._running is None else self._running.energy_j)

    def has_clock_permission(self) -> bool:
        return self.permission

    def _request(self, action: int) -> None:
        with self._lock:
            now_s = self.clock.now_s()
            self._simulate(now_s)
            latency_s = self.latency_s
            if self.latency_std_s > 0:
                latency_s = max(0.0, float(self._latency_rng.normal(self.latency_s, self.latency_std_s)))
            self.latencies_s.append(latency_s)
            effective_s = max(now_s + latency_s, self._changes[-1][0] if self._changes else 0.0)
            self._changes.append((effective_s, action))

    def lock_clocks_mhz(self, core_mhz: int | None, mem_mhz: int) -> None:
        self._record("lock_clocks_mhz", core_mhz, mem_mhz)
        if not self.permission:
            raise NvmlPermissionError("cannot lock the clocks of fake GPU 0: no permission; run as root")
        check_clocks_mhz(self.supported_clocks_mhz(), core_mhz, mem_mhz, f"fake GPU 0 ({self.name})")
        self._request(self.costs.index_of(f"{'auto' if core_mhz is None else core_mhz}:{mem_mhz}"))

    def reset_clocks(self) -> None:
        self._record("reset_clocks")
        self._request(self.costs.auto_index)

    def _begin(self) -> _Running:
        index = len(self.steps)
        costs = self.step_costs.get(index, self.costs)
        kernels = costs.kernels
        factors = (1.0, 1.0) if self._drift is None else self._drift.factors(self._end_s)
        noise = np.exp(self._noise_rng.normal(0.0, self.duration_noise, kernels)) if self.duration_noise > 0 \
            else np.ones(kernels)
        delays_s = {kernel: delay_s for (step, kernel), delay_s in self.delays_s.items() if step == index}
        self._running = _Running(costs, self._end_s, *factors, noise, delays_s, np.empty(kernels, dtype=np.int64),
                                 now_s=self._end_s)
        return self._running

    def _apply_changes(self, run: _Running) -> None:
        """Apply the changes due by ``run.now_s``, each with its stall (lock held)."""
        while self._changes and self._changes[0][0] <= run.now_s:
            _, action = self._changes.pop(0)
            if action != self._action:
                self._action = action
                stall_j = self.stall_s * float(self.costs.idle_power_w[action])
                run.now_s += self.stall_s
                run.model_time_s += self.stall_s
                run.energy_j += stall_j
                run.model_energy_j += stall_j

    def _simulate(self, until_s: float) -> _Running:
        """Run the current step's kernels that start at or before ``until_s`` (lock held)."""
        run = self._running or self._begin()
        costs = run.costs
        while run.kernel < costs.kernels and run.now_s + run.delays_s.get(run.kernel, 0.0) <= until_s:
            k = run.kernel
            run.now_s += run.delays_s.get(k, 0.0)
            self._apply_changes(run)
            run.applied[k] = action = self._action
            run.kernel_start_s.append(run.now_s)
            time_s, energy_j = float(costs.time_s[k, action]), float(costs.energy_j[k, action])
            run.now_s += time_s * run.time_factor * float(run.noise[k])
            run.energy_j += energy_j * run.energy_factor * float(run.noise[k])
            run.model_time_s += time_s
            run.model_energy_j += energy_j
            run.kernel += 1
        return run

    def kernel_start_s(self, kernel: int) -> float:
        """When kernel ``kernel`` of the current step starts (virtual s), simulating up to it."""
        with self._lock:
            run = self._running or self._begin()
            target = min(kernel, run.costs.kernels - 1)
            while run.kernel <= target:
                self._simulate(run.now_s + run.delays_s.get(run.kernel, 0.0))
            return run.kernel_start_s[target]

    def passed_kernels(self) -> int:
        """How many kernels of the current step have started by the virtual now."""
        with self._lock:
            return self._simulate(self.clock.now_s()).kernel

    def run_step(self, extra_s: float = 0.0) -> FakeStep:
        """Run the current step to its end, then ``extra_s`` of idle work (e.g. an evaluation pass)."""
        with self._lock:
            run = self._simulate(np.inf)
            idle_j = extra_s * float(self.costs.idle_power_w[self._action])
            end_s = run.now_s + extra_s
            step = FakeStep(run.start_s, end_s, run.energy_j + idle_j, run.applied, run.time_factor,
                            run.energy_factor, run.model_time_s + extra_s, run.model_energy_j + idle_j,
                            np.array(run.kernel_start_s))
            self._energy_j += step.energy_j
            self._power_w = step.energy_j / (end_s - run.start_s)
            self._end_s, self._running = end_s, None
        self.steps.append(step)
        self.clock.advance_to(end_s)
        return step


class FakeStepTimeline:
    """Steps of a :class:`FakeGpu`: each runs to its end when the controller waits for it.

    ``shapes[i]`` is step ``i``'s shape (pair it with ``FakeGpu.step_costs[i]``, the step it runs);
    ``irregular[i] = (extra_s, signature)`` makes step ``i`` (0-based) take ``extra_s`` longer and count
    ``signature`` allocations (an evaluation pass); other steps count ``NORMAL_SIGNATURE``.

    Anchors: each step has one before each kernel of ``anchor_kernels``, at that kernel's start on the GPU
    (simulated up to it when the controller's thread waits for it). ``late[i] = (index, delay_s)`` delays
    step ``i``'s work from anchor ``index`` on by ``delay_s`` (the step ends that much later too);
    ``anchors[i] = times`` replaces step ``i``'s anchor offsets from its start (s: missing or disordered
    anchors).
    """

    def __init__(self, gpu: FakeGpu, clock: VirtualClock, anchor_kernels: tuple[int, ...] = ()) -> None:
        self.gpu, self.clock, self.anchor_kernels = gpu, clock, anchor_kernels
        self.irregular: dict[int, tuple[float, int]] = {}
        self.shapes: dict[int, StepShape] = {}
        """The shape of step ``i`` (a run whose steps vary: :meth:`shape_of`)."""
        self.late: dict[int, tuple[int, float]] = {}
        self.anchors: dict[int, tuple[float, ...]] = {}
        self._marked = 0

    def _sync(self) -> None:
        """Hand the late steps to the GPU as delays before their anchors' kernels."""
        for step, (index, delay_s) in self.late.items():
            self.gpu.delays_s[(step, self.anchor_kernels[index])] = delay_s

    def mark(self) -> tuple[float, int, int]:
        extra_s, signature = self.irregular.get(self._marked, (0.0, NORMAL_SIGNATURE))
        self._marked += 1
        return extra_s, signature, self._marked - 1

    def wait(self, token: tuple[float, int, int], expected_s: float = -math.inf) -> StepEnd:
        extra_s, signature, index = token
        self._sync()
        step = self.gpu.run_step(extra_s)
        if index in self.anchors:
            anchors_s = tuple(step.start_s + offset_s for offset_s in self.anchors[index])
        else:
            anchors_s = tuple(float(step.kernel_start_s[k]) for k in self.anchor_kernels)
        return StepEnd(step.end_s, step.end_s - step.start_s, signature, anchors_s)

    def shape_of(self, step: int, deadline_s: float) -> StepShape | None:
        """Step ``step``'s shape, known at once (the training loop is always ahead in a simulation)."""
        return self.shapes.get(step)

    def _anchor_time_s(self, step: int, index: int) -> float | None:
        """Anchor ``index`` of the running step ``step`` (simulated up to it), None if it has none."""
        self._sync()
        if step in self.anchors:
            offsets_s = self.anchors[step]
            return None if index >= len(offsets_s) else self.gpu.kernel_start_s(0) + offsets_s[index]
        return None if index >= len(self.anchor_kernels) else self.gpu.kernel_start_s(self.anchor_kernels[index])

    def anchor_s(self, step: int, index: int, deadline_s: float) -> float | None:
        time_s = self._anchor_time_s(step, index)
        if time_s is not None:
            self.clock.advance_to(time_s)
        return time_s

    def passed_anchor(self, step: int, after: int) -> tuple[int, float] | None:
        latest = None
        now_s, passed = self.clock.now_s(), self.gpu.passed_kernels()
        for index in range(after + 1, len(self.anchors.get(step, self.anchor_kernels))):
            if step not in self.anchors and passed <= self.anchor_kernels[index]:
                break
            time_s = self._anchor_time_s(step, index)
            if time_s is None or time_s > now_s:
                break
            latest = (index, time_s)
        return latest
