"""Joules and seconds per step over windows of steps, TensorBoard scalars, and the figures of the summary.

The NVML total-energy counter updates ~10 times a second on an H200, so energy is measured over windows
of at least ``window_steps`` steps and ``window_s`` seconds with :class:`kdvfs.runtime.device.energy.WindowSampler`
(average power between the first and last counter update in the window). Seconds per step are the GPU
step times of the window (CUDA events); joules per step are the window's average power times that. The
last, partial window of a run is not counted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kdvfs.runtime.controller.actuator import EventLog
from kdvfs.runtime.device.energy import Meter, WindowSampler
from kdvfs.runtime.device.errors import DeviceError
from kdvfs.runtime.device.host_time import Clock


@dataclass(frozen=True)
class Window:
    """One accounting window: its last step, steps, seconds and joules per step, power (W), controlled steps."""

    last_step: int
    steps: int
    step_time_s: float
    energy_j_per_step: float | None
    avg_power_w: float | None
    controlled_steps: int


class Accounting:
    """Collects step times and energy windows (see the module docstring); writes each window to the log
    and, with ``tensorboard`` (a folder), as TensorBoard scalars under ``kdvfs/``."""

    def __init__(self, meter: Meter | None, clock: Clock, window_steps: int, window_s: float, log: EventLog,
                 tensorboard: str | None = None, poll_s: float = 0.02) -> None:
        self.windows: list[Window] = []
        self._sampler = WindowSampler(meter, poll_s, clock.now_s) if meter is not None else None
        self._clock, self._window_steps, self._window_s, self._log = clock, window_steps, window_s, log
        self._writer: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(tensorboard)
        self._durations: list[float] = []
        self._controlled = 0
        self._start_s = 0.0

    def start(self) -> None:
        """Open the first window (at a step boundary)."""
        self._durations, self._controlled, self._start_s = [], 0, self._clock.now_s()
        if self._sampler is not None:
            self._sampler.start()

    def step(self, index: int, duration_s: float, controlled: bool) -> None:
        """One finished step; closes the window once it is long enough."""
        self._durations.append(duration_s)
        self._controlled += controlled
        long_enough = self._clock.now_s() - self._start_s >= self._window_s
        if len(self._durations) >= self._window_steps and long_enough:
            self._close_window(index)
            self.start()

    def _close_window(self, index: int) -> None:
        power_w = None
        if self._sampler is not None:
            try:
                power_w = self._sampler.stop().avg_power_w
            except DeviceError as error:
                self._log.write("energy_unavailable", step=index, reason=str(error))
        step_s = float(np.mean(self._durations))
        window = Window(index, len(self._durations), step_s, None if power_w is None else power_w * step_s,
                        power_w, self._controlled)
        self.windows.append(window)
        self._log.write("window", **asdict(window))
        if self._writer is not None:
            for name, value in (("step_time_s", window.step_time_s), ("energy_j_per_step", window.energy_j_per_step),
                                ("avg_power_w", window.avg_power_w),
                                ("controlled_fraction", window.controlled_steps / window.steps)):
                if value is not None:
                    self._writer.add_scalar(f"kdvfs/{name}", value, index)

    def close(self) -> None:
        """Stop sampling. The last, partial window is not counted: the GPU may have stopped before its end."""
        if self._sampler is not None:
            self._sampler.cancel()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def figures(self) -> dict[str, float | int | None]:
        """Whole-run figures: steps, mean GPU step time (s), measured joules per step (all windows with
        energy, and split into windows entirely in auto mode and entirely controlled)."""
        def mean_energy(windows: list[Window]) -> float | None:
            measured = [(w.energy_j_per_step, w.steps) for w in windows if w.energy_j_per_step is not None]
            steps = sum(n for _, n in measured)
            return sum(j * n for j, n in measured) / steps if steps else None

        steps = sum(w.steps for w in self.windows)
        return {
            "window_steps": steps, "windows": len(self.windows),
            "step_time_s": sum(w.step_time_s * w.steps for w in self.windows) / steps if steps else None,
            "energy_j_per_step": mean_energy(self.windows),
            "energy_j_per_step_auto": mean_energy([w for w in self.windows if w.controlled_steps == 0]),
            "energy_j_per_step_controlled": mean_energy([w for w in self.windows if w.controlled_steps == w.steps]),
        }
