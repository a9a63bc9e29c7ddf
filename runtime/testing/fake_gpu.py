"""A fake GPU for tests: the :class:`~kdvfs.runtime.device.interface.Device` interface simulated by the cost model
(:class:`FakeGpu`), the virtual clock it runs on (:class:`VirtualClock`) and its step timeline
(:class:`FakeStepTimeline`, a :class:`~kdvfs.runtime.controller.gpu_timeline.StepTimeline`).

It runs training steps of one trace on a virtual clock (no sleeping): each kernel at the clocks in effect
when it starts, priced by the step's :class:`~kdvfs.envs.model.schedule.ActionCosts`; a clock request takes effect
the profile's switching latency after it was made and stalls the GPU for ``stall_s`` at idle power, as in
:mod:`kdvfs.envs.model.schedule`. With a :class:`~kdvfs.envs.model.drift.DriftModel` each step's kernel
times and energies are scaled by that step's drift and noise factors (the same for every clock: the true
relative effect of a schedule stays the cost model's). Every device call is recorded with its virtual time.
It is only ever used when a caller constructs it: kdvfs never falls back to it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.cost_model import Array
from kdvfs.envs.model.drift import Drift, DriftModel
from kdvfs.envs.model.schedule import ActionCosts
from kdvfs.runtime.controller.gpu_timeline import StepEnd
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
    and the drift and noise factors its time and energy were scaled by (1 without a drift model)."""

    start_s: float
    end_s: float
    energy_j: float
    applied: Array = field(repr=False)
    time_factor: float = 1.0
    energy_factor: float = 1.0


class FakeGpu:
    """A simulated GPU running the step priced by ``costs`` (see the module docstring).

    Args:
        costs: the step's time and energy under every action.
        profile: the GPU (name, supported clocks, default memory clock).
        latency_s, stall_s: switching latency and stall per change (s).
        clock: the virtual clock shared with the code under test.
        permission: what :meth:`has_clock_permission` answers.
        drift: thermal drift and step noise (default: none).
    """

    def __init__(self, costs: ActionCosts, profile: GpuProfile, latency_s: float, stall_s: float,
                 clock: VirtualClock, permission: bool = True, drift: DriftModel | None = None) -> None:
        self.index, self.name = 0, profile.model
        self.costs, self.profile, self.latency_s, self.stall_s = costs, profile, latency_s, stall_s
        self.clock, self.permission = clock, permission
        self.calls: list[DeviceCall] = []
        self.steps: list[FakeStep] = []
        self._changes: list[tuple[float, int]] = []
        self._action = costs.auto_index
        self._energy_j, self._power_w, self._end_s = 0.0, 0.0, 0.0
        self._lock = threading.Lock()
        self._drift = Drift(drift) if drift is not None else None

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append(DeviceCall(self.clock.now_s(), name, args))

    @property
    def set_calls(self) -> list[DeviceCall]:
        """Calls that change clocks."""
        return [call for call in self.calls if call.name in ("lock_clocks_mhz", "reset_clocks")]

    def supported_clocks_mhz(self) -> dict[int, tuple[int, ...]]:
        clocks = self.profile.clocks
        return {mem: tuple(clocks.core_mhz[mem]) for mem in clocks.memory_mhz}

    def clocks_mhz(self) -> tuple[float, float]:
        core, mem = self.costs.core_mhz[self._action], self.costs.mem_mhz[self._action]
        return float(self.profile.clocks.max_core_mhz if np.isnan(core) else core), float(mem)

    def power_w(self) -> float:
        return self._power_w

    def energy_j(self) -> float:
        with self._lock:
            return self._energy_j

    def has_clock_permission(self) -> bool:
        return self.permission

    def _request(self, action: int) -> None:
        with self._lock:
            self._changes.append((self.clock.now_s() + self.latency_s, action))

    def lock_clocks_mhz(self, core_mhz: int | None, mem_mhz: int) -> None:
        self._record("lock_clocks_mhz", core_mhz, mem_mhz)
        if not self.permission:
            raise NvmlPermissionError("cannot lock the clocks of fake GPU 0: no permission; run as root")
        check_clocks_mhz(self.supported_clocks_mhz(), core_mhz, mem_mhz, f"fake GPU 0 ({self.name})")
        self._request(self.costs.index_of(f"{'auto' if core_mhz is None else core_mhz}:{mem_mhz}"))

    def reset_clocks(self) -> None:
        self._record("reset_clocks")
        self._request(self.costs.auto_index)

    def run_step(self, extra_s: float = 0.0) -> FakeStep:
        """Run one step right after the previous one, then ``extra_s`` of idle work (e.g. an evaluation pass)."""
        with self._lock:
            now_s, energy_j = self._end_s, 0.0
            time_factor, energy_factor = (1.0, 1.0) if self._drift is None else self._drift.factors(now_s)
            applied = np.empty(self.costs.kernels, dtype=np.int64)
            for kernel in range(self.costs.kernels):
                while self._changes and self._changes[0][0] <= now_s:
                    _, action = self._changes.pop(0)
                    if action != self._action:
                        self._action = action
                        now_s += self.stall_s
                        energy_j += self.stall_s * float(self.costs.idle_power_w[action])
                applied[kernel] = self._action
                now_s += float(self.costs.time_s[kernel, self._action]) * time_factor
                energy_j += float(self.costs.energy_j[kernel, self._action]) * energy_factor
            now_s += extra_s
            energy_j += extra_s * float(self.costs.idle_power_w[self._action])
            step = FakeStep(self._end_s, now_s, energy_j, applied, time_factor, energy_factor)
            self._energy_j += energy_j
            self._power_w = energy_j / (now_s - self._end_s)
            self._end_s = now_s
        self.steps.append(step)
        self.clock.advance_to(now_s)
        return step


class FakeStepTimeline:
    """Steps of a :class:`FakeGpu`: each runs when the controller waits for it, after the requests made so far.

    ``irregular[i] = (extra_s, signature)`` makes step ``i`` (0-based) take ``extra_s`` longer and count
    ``signature`` allocations (an evaluation pass); other steps count ``NORMAL_SIGNATURE``.

    Anchors: each step has one before each kernel of ``anchor_kernels``, at that kernel's start on the GPU.
    While a step has not run yet (:meth:`anchor_s`, from the controller's thread during the step) its
    kernels are timed at auto clocks, which a dry run keeps. ``late[i] = (index, delay_s)`` delays step
    ``i``'s work from anchor ``index`` on by ``delay_s`` (the step ends that much later too);
    ``anchors[i] = times`` replaces step ``i``'s anchor offsets from its start (s: missing or disordered
    anchors).
    """

    def __init__(self, gpu: FakeGpu, clock: VirtualClock, anchor_kernels: tuple[int, ...] = ()) -> None:
        self.gpu, self.clock, self.anchor_kernels = gpu, clock, anchor_kernels
        self.irregular: dict[int, tuple[float, int]] = {}
        self.late: dict[int, tuple[int, float]] = {}
        self.anchors: dict[int, tuple[float, ...]] = {}
        self._marked = 0

    def mark(self) -> tuple[float, int, int]:
        extra_s, signature = self.irregular.get(self._marked, (0.0, NORMAL_SIGNATURE))
        self._marked += 1
        return extra_s + self.late.get(self._marked - 1, (0, 0.0))[1], signature, self._marked - 1

    def _offsets_s(self, step: int, applied: np.ndarray) -> tuple[float, ...]:
        if step in self.anchors:
            return self.anchors[step]
        costs = self.gpu.costs
        durations_s = costs.time_s[np.arange(costs.kernels), applied]
        starts_s = np.cumsum(durations_s) - durations_s
        late, delay_s = self.late.get(step, (len(self.anchor_kernels), 0.0))
        return tuple(float(starts_s[k]) + (delay_s if i >= late else 0.0) for i, k in enumerate(self.anchor_kernels))

    def wait(self, token: tuple[float, int, int]) -> StepEnd:
        extra_s, signature, index = token
        step = self.gpu.run_step(extra_s)
        anchors_s = tuple(step.start_s + offset_s for offset_s in self._offsets_s(index, step.applied))
        return StepEnd(step.end_s, step.end_s - step.start_s, signature, anchors_s)

    def anchor_s(self, step: int, index: int, deadline_s: float) -> float | None:
        start_s = self.gpu.steps[-1].end_s if self.gpu.steps else 0.0
        offsets_s = self._offsets_s(step, np.full(self.gpu.costs.kernels, self.gpu.costs.auto_index))
        if index >= len(offsets_s):
            return None
        self.clock.advance_to(start_s + offsets_s[index])
        return start_s + offsets_s[index]
