"""What the controller costs the host: the CPU time of its threads and hooks, per step and as a share of the
step's time, and how often its thread woke.

The controller's thread (the issuer) and the energy counter's thread each report their own CPU time
(``time.thread_time`` when they stop); the hooks that mark steps and anchors run on the training threads, and
their wall time is their CPU (they never block). Their sum over the steps the controller saw, against the mean
time between step ends, is the controller's host cost; the thread's wakes (sleeps on its clock and looks at the
GPU's events) say whether it slept until it had work.
"""

from __future__ import annotations

from typing import Any


def host_cost(thread_s: float, energy_s: float | None, hooks_s: float | None, steps: int,
              step_interval_s: float | None, wakes: int) -> dict[str, Any]:
    """The summary's ``host_cost``: CPU (ms) of the controller's thread, the energy thread (None: no energy
    measurement) and the hooks (None: not recorded), in all and per step, the per-step total's share of the
    mean step time (%; None before two step ends), and the thread's wakes in all and per step."""
    total_s = thread_s + (energy_s or 0.0) + (hooks_s or 0.0)
    per_step_ms = 1e3 * total_s / steps if steps else None
    return {
        "thread_ms": 1e3 * thread_s, "energy_thread_ms": None if energy_s is None else 1e3 * energy_s,
        "hooks_ms": None if hooks_s is None else 1e3 * hooks_s, "total_ms": 1e3 * total_s,
        "per_step_ms": per_step_ms,
        "thread_per_step_ms": 1e3 * thread_s / steps if steps else None,
        "step_share_pct": None if per_step_ms is None or not step_interval_s
        else 100.0 * per_step_ms / (1e3 * step_interval_s),
        "thread_step_share_pct": None if not steps or not step_interval_s
        else 100.0 * thread_s / steps / step_interval_s,
        "wakes": wakes, "wakes_per_step": wakes / steps if steps else None,
    }
