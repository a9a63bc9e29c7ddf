"""Energy and clocks over a measurement window, from a GPU's NVML total-energy counter.

The counter updates only ~10 times per second on an H200, so the energy of a short window is quantised.
A :class:`WindowSampler` polls it (every 10 ms by default) together with the SM and memory clocks on a
background thread; the window's average power is the energy between the first and the last counter
update seen inside the window over the time between those updates, which removes the quantisation at
both ends. Read-only: it only calls a :class:`Meter`'s getters (a
:class:`~kdvfs.runtime.device.nvml_device.GpuReader` on a real GPU).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kdvfs.runtime.device.errors import DeviceError


class Meter(Protocol):
    """What the sampler reads: a cumulative energy counter (J) and the SM and memory clocks (MHz)."""

    def energy_j(self) -> float: ...

    def clocks_mhz(self) -> tuple[float, float]: ...


@dataclass(frozen=True)
class Sample:
    """One reading: monotonic time (s), cumulative energy (J), SM and memory clocks (MHz)."""

    time_s: float
    energy_j: float
    sm_mhz: float
    mem_mhz: float


@dataclass(frozen=True)
class WindowReading:
    """What a window measured: its length (s), average power (W), median clocks (MHz), counter updates seen."""

    elapsed_s: float
    avg_power_w: float
    sm_mhz: float
    mem_mhz: float
    counter_updates: int

    @property
    def energy_j(self) -> float:
        """Energy of the whole window (J)."""
        return self.avg_power_w * self.elapsed_s


def read_window(samples: Sequence[Sample]) -> WindowReading:
    """The average power and median clocks of a window from its samples (first and last at its edges).

    Raises:
        DeviceError: fewer than two samples, a window of no length, or a counter that did not advance.
    """
    if len(samples) < 2 or samples[-1].time_s <= samples[0].time_s:
        raise DeviceError("the measurement window holds no time; measure over a longer window")
    energy = np.array([s.energy_j for s in samples])
    times = np.array([s.time_s for s in samples])
    updates = np.flatnonzero(np.diff(energy) != 0) + 1
    first, last = (updates[0], updates[-1]) if len(updates) >= 2 else (0, len(samples) - 1)
    joules, seconds = energy[last] - energy[first], times[last] - times[first]
    if joules <= 0 or seconds <= 0:
        raise DeviceError(f"the GPU's energy counter did not advance over {times[-1] - times[0]:.2f} s "
                          f"({len(updates)} updates); measure over a longer window")
    return WindowReading(elapsed_s=float(times[-1] - times[0]), avg_power_w=float(joules / seconds),
                         sm_mhz=float(np.median([s.sm_mhz for s in samples])),
                         mem_mhz=float(np.median([s.mem_mhz for s in samples])), counter_updates=len(updates))


class WindowSampler:
    """Samples a :class:`Meter` between :meth:`start` and :meth:`stop` on a background thread.

    ``start`` and ``stop`` each take one sample on the caller's thread, so the window's edges are where
    the caller put them (e.g. right after ``torch.cuda.synchronize()``). ``now_s`` is the time base
    (``time.monotonic``; the controller's tests pass a virtual clock).
    """

    def __init__(self, meter: Meter, interval_s: float = 0.01, now_s: Callable[[], float] = time.monotonic) -> None:
        self._meter = meter
        self._interval_s = interval_s
        self._now_s = now_s
        self._samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _sample(self) -> Sample:
        sm_mhz, mem_mhz = self._meter.clocks_mhz()
        return Sample(self._now_s(), self._meter.energy_j(), sm_mhz, mem_mhz)

    def _poll(self) -> None:
        try:
            while not self._stop.wait(self._interval_s):
                self._samples.append(self._sample())
        except BaseException as error:  # re-raised on the caller's thread by stop()
            self._error = error

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Take the first sample and start polling."""
        self._samples, self._error = [self._sample()], None
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="kdvfs-energy-sampler", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        """Stop polling and discard the window."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def stop(self) -> WindowReading:
        """Stop polling, take the last sample and read the window."""
        self.cancel()
        if self._error is not None:
            raise self._error
        self._samples.append(self._sample())
        return read_window(self._samples)
