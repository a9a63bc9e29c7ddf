"""What a controller measures of a running step, in the environment's terms (:class:`LiveState`), and the
prediction's time for what it has run (:class:`PredictedElapsed`).

A controller running a frozen policy inside real training cannot simulate the step: it measures where the
GPU is and what it spent, and :func:`~kdvfs.envs.env.observing.live_tables.observe_at` turns that into the observation
the policy was trained on; the environment observes its own simulated state in the same terms
(:meth:`~kdvfs.envs.env.dvfs_env.KernelDVFSEnv.live_state`) through the same function. Times are on the
step's model timeline: host seconds divided by the run's measured scale of the auto step (the A windows'
seconds per step over the model's auto step time), so that a GPU drifting as a whole shows as drift, not
as budget used. A controller does not know what the executed step would take at auto, only what the
prediction says: the environment observes its own simulated step the same way.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class LiveState(NamedTuple):
    """One live decision point of a running step (a named tuple: a controller makes one at every decision point,
    and its fields in order are the compiled live decision's arguments).

    Attributes:
        kernel: the kernel the GPU is at (its start has passed), from 0.
        in_effect: grid action in effect.
        pending: grid action requested and not yet in effect; -1 if none.
        pending_age_s: time since that request (s; 0 if none).
        elapsed_s: the step's time so far (s, model timeline), plus the run's carried budget use (below).
        auto_elapsed_s: what the prediction says the kernels before ``kernel`` take at auto (s, model timeline).
        last_latency_ratio: the last change's measured latency over the mean (1 if none measured).
        auto_drift_pct: how much slower auto's step runs than the model's (%, the A windows').
        model_elapsed_s: what the prediction says the kernels before ``kernel`` take at the clocks they ran at,
            stalls included (s, model timeline; :class:`PredictedElapsed`); 0: not measured, the prediction
            error reads 0.
    """

    kernel: int
    in_effect: int
    pending: int
    pending_age_s: float
    elapsed_s: float
    auto_elapsed_s: float
    last_latency_ratio: float = 1.0
    auto_drift_pct: float = 0.0
    model_elapsed_s: float = 0.0


class PredictedElapsed:
    """The prediction's time for the kernels a step has run, at the clocks each ran at (``model_elapsed_s``),
    accumulated from a controller's successive readings of (kernel, pair in effect).

    Kernels between two readings are counted at the pair in effect at the first; a change of pair adds one
    stall. Invariant: readings within a step never go back a kernel (a reading before the last counts nothing).

    Args:
        cumulative_s: (K + 1, G) the prediction's start time of each kernel at each grid pair (model s).
        stall_s: GPU stall per clock change (s).
        factors: (G,) factor on each pair's kernel times (the measured drift:
            :func:`kdvfs.envs.env.observing.measured.drift_factors`); None: 1.
    """

    def __init__(self, cumulative_s: np.ndarray, stall_s: float, factors: np.ndarray | None = None) -> None:
        self.cumulative_s, self.stall_s = cumulative_s, stall_s
        self.factors = np.ones(cumulative_s.shape[1]) if factors is None else factors
        self.restart()

    def restart(self) -> None:
        """A new step: nothing run; the first reading's pair is taken as in effect from its start."""
        self._kernel, self._pair, self.seconds = 0, -1, 0.0

    def at(self, kernel: int, in_effect: int) -> float:
        """The prediction's time before ``kernel`` (s), now that ``in_effect`` is the pair in effect."""
        kernel = min(max(kernel, self._kernel), len(self.cumulative_s) - 1)
        pair = in_effect if self._pair < 0 else self._pair
        self.seconds += float(self.cumulative_s[kernel, pair] - self.cumulative_s[self._kernel, pair]) \
            * float(self.factors[pair])
        if self._pair >= 0 and in_effect != self._pair:
            self.seconds += self.stall_s
        self._kernel, self._pair = kernel, in_effect
        return self.seconds

    def reading(self, in_effect: int) -> tuple[int, float, int, float]:
        """What :meth:`at` would count from at a later kernel with ``in_effect`` in effect, without reading it: the
        pair whose times the kernels since the last reading run at, the time so far (s) with the stall of a change
        to ``in_effect``, the last reading's kernel and the pair's factor. :meth:`at` at kernel k (none before that
        kernel) is that time plus the factor times ``cumulative_s[k, pair]`` less ``cumulative_s[kernel, pair]``
        (up to rounding)."""
        pair = in_effect if self._pair < 0 else self._pair
        stall_s = self.stall_s if self._pair >= 0 and in_effect != self._pair else 0.0
        return pair, self.seconds + stall_s, self._kernel, float(self.factors[pair])
