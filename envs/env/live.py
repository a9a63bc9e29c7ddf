"""What a controller measures of a running step, in the environment's terms (:class:`LiveState`).

A controller running a frozen policy inside real training cannot simulate the step: it measures where the
GPU is and what it spent, and :meth:`kdvfs.envs.env.dvfs_env.KernelDVFSEnv.observe_live` turns that into the
observation the policy was trained on (the same observation spec, the same advisors). Times are on the
step's model timeline: host seconds divided by the run's measured scale of the auto step (the A windows'
seconds per step over the model's auto step time), so that a GPU drifting as a whole shows as drift, not
as budget used.
"""

from __future__ import annotations

from typing import NamedTuple


class LiveState(NamedTuple):
    """One live decision point of a running step (a named tuple: a controller makes one at every decision point,
    and its fields in order are the compiled live decision's arguments).

    Attributes:
        kernel: the kernel the GPU is at (its start has passed), from 0.
        in_effect: grid action in effect.
        pending: grid action requested and not yet in effect; -1 if none.
        pending_age_s: time since that request (s; 0 if none).
        elapsed_s: the step's time so far (s, model timeline), plus the run's carried budget use (below).
        auto_elapsed_s: what the kernels before ``kernel`` take at auto (s, model timeline).
        last_latency_ratio: the last change's measured latency over the mean (1 if none measured).
        auto_drift_pct: how much slower auto's step runs than the model's (%, the A windows').
    """

    kernel: int
    in_effect: int
    pending: int
    pending_age_s: float
    elapsed_s: float
    auto_elapsed_s: float
    last_latency_ratio: float = 1.0
    auto_drift_pct: float = 0.0
