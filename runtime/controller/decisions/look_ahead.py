"""The states a step is expected to pass through ahead, for reading a budget-dependent standing order's proposals
ahead (the ``proposal`` wake, docs/design/controller.md), in one compiled call on the controller's thread.

:func:`states_ahead` gives, at each of ``n`` points one decision interval apart after now, what a decision there
would observe with nothing pending: the kernel running (from the last anchor passed, at the step's pace;
:meth:`~kdvfs.runtime.controller.timing.step_times.StepTimes.kernel_running`), the step's elapsed time and the
prediction's auto and at-the-clocks-run times before that kernel
(:class:`~kdvfs.envs.env.observing.live.PredictedElapsed`). Each is the same float operation, in the same order,
as the elementwise numpy it replaces: the states are equal to the last bit.
"""

from __future__ import annotations

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.compiled import compiled


@compiled
def states_ahead(host_s: Array, anchor_kernel: int, anchor_s: float, now_s: float, interval_s: float, n: int,
                 least_kernel: int, start_s: float, scale: float, cumulative_s: Array, predicted_pair: int,
                 predicted_s: float, predicted_kernel: int, predicted_factor: float
                 ) -> tuple[Array, Array, Array, Array]:
    """The ``n`` states ahead: (n,) int64 kernels and (n,) float64 elapsed, auto-elapsed and model-elapsed times
    (s, model timeline).

    Point j (from 0) is at host time ``now_s + interval_s * (j + 1)``. Its kernel is the one running then after
    the anchor passed at ``anchor_s`` (host s) at kernel ``anchor_kernel``, on the kernels' host times from the
    step's start ``host_s`` ((K+1,), increasing, the last the step's end), never before the anchor's nor past the
    last kernel, nor before ``least_kernel`` (the last decision's). Elapsed: since ``start_s`` (host s) over
    ``scale`` (host s per model s). Auto-elapsed: ``cumulative_s[kernel, 0]``. Model-elapsed: ``predicted_s``
    plus ``predicted_factor`` times ``cumulative_s``'s rise at ``predicted_pair`` from ``predicted_kernel`` to the
    kernel (none before it): :meth:`~kdvfs.envs.env.observing.live.PredictedElapsed.reading`'s four values."""
    kernels = np.empty(n, dtype=np.int64)
    elapsed_s, auto_elapsed_s, model_elapsed_s = np.empty(n), np.empty(n), np.empty(n)
    last, base_s = host_s.shape[0] - 2, host_s[anchor_kernel]
    for j in range(n):
        time_s = now_s + interval_s * (j + 1)
        at_s = base_s + (time_s - anchor_s)
        low, high = 0, host_s.shape[0]
        while low < high:  # the kernels started by then (numpy's searchsorted, side "right")
            middle = (low + high) // 2
            if at_s < host_s[middle]:
                high = middle
            else:
                low = middle + 1
        kernel = max(min(max(low - 1, anchor_kernel), last), least_kernel)
        kernels[j] = kernel
        elapsed_s[j] = (time_s - start_s) / scale
        auto_elapsed_s[j] = cumulative_s[kernel, 0]
        model_elapsed_s[j] = predicted_s + (cumulative_s[max(kernel, predicted_kernel), predicted_pair]
                                            - cumulative_s[predicted_kernel, predicted_pair]) * predicted_factor
    return kernels, elapsed_s, auto_elapsed_s, model_elapsed_s


def prepare_states_ahead(cumulative_s: Array) -> None:
    """Compile :func:`states_ahead` for a step's ``cumulative_s`` (or load it from numba's cache) now, not in a
    controlled step."""
    states_ahead(np.zeros(2), 0, 0.0, 0.0, 1.0, 1, 0, 0.0, 1.0, cumulative_s, 0, 0.0, 0, 1.0)
