"""``kdvfs calibrate --sweep``: the microbenchmarks at a grid of locked clock pairs (needs clock permission).

For every pair the SM and memory clocks are locked, the GPU settles, and the idle power and every
microbenchmark are measured at the clocks the GPU then runs (a locked clock is an upper bound: the power
cap may still lower it). The GPU's clocks are restored afterwards, also on an error or SIGTERM
(:func:`kdvfs.runtime.device.nvml_device.locked_clocks`). Each pair's idle row is its own sweep kernel, so it
only informs the power fit. Through ``kdvfs daemon`` (a :class:`~kdvfs.runtime.daemon.client.DaemonDevice`)
the daemon holds the GPU's lease and checks and sets each pair; the restore is the same.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.runtime.daemon.client import DaemonDevice
from kdvfs.runtime.device.lease import GpuLease
from kdvfs.runtime.device.nvml_device import NvmlDevice, locked_clocks
from kdvfs.runtime.microbench.measure import Measurement
from kdvfs.runtime.microbench.profile_fit import nearest_clock

SETTLE_S = 0.5


def clock_grid(profile: GpuProfile, core_points: int = 5, lowest_fraction: float = 0.4) -> list[tuple[int, int]]:
    """(core, memory) pairs: ``core_points`` core clocks from ``lowest_fraction`` of the maximum up to it, at
    every memory clock; highest first."""
    pairs = []
    for mem in profile.clocks.memory_mhz:
        cores = profile.clocks.core_mhz[mem]
        targets = np.linspace(lowest_fraction * max(cores), max(cores), core_points)
        chosen = sorted({nearest_clock(float(t), cores) for t in targets}, reverse=True)
        pairs += [(core, mem) for core in chosen]
    return pairs


@contextlib.contextmanager
def _owned(device: NvmlDevice | DaemonDevice) -> Iterator[object]:
    """The GPU's lease (this process's through NVML; the daemon's, leased to this connection, through it) and,
    inside it, the clocks restored on exit, on an exception and on SIGTERM."""
    if isinstance(device, NvmlDevice):
        with GpuLease(device.uuid(), device.index), locked_clocks(device) as owned:  # lease released after restore
            yield owned
        return
    device.lease()
    with locked_clocks(device) as owned:
        yield owned


def measure_clock_sweep(device: NvmlDevice | DaemonDevice, pairs: Sequence[tuple[int, int]],
                        measure: Callable[[str], list[Measurement]], settle_s: float = SETTLE_S
                        ) -> list[Measurement]:
    """Lock each pair on the open ``device``, wait ``settle_s``, collect ``measure(idle_name)``; clocks restored
    at the end. The GPU's lease is held throughout (:class:`~kdvfs.runtime.device.lease.LeaseHeldError` before
    any clock change when another process or daemon client holds it)."""
    rows: list[Measurement] = []
    with _owned(device):
        for core, mem in pairs:
            device.lock_clocks_mhz(core, mem)
            time.sleep(settle_s)
            rows += measure(f"idle@{core}:{mem}")
    return rows
