"""The residual policy's observation, compiled (numba): :func:`observe_residual`, the one computation behind
:func:`~kdvfs.envs.env.observing.measured.residual_observation` (the environment's and a Python caller's entry)
and a controller's compiled decisions and look-ahead
(:mod:`kdvfs.agents.learned.policy.residual_decision`).

The arithmetic is the Python observation's it replaced, operation for operation (float64 where Python computed
in floats, each entry clipped in float64 and stored as float32; the fitting plan's figures read from the float32
observation), so the observation is the same bit for bit. It keeps the interpreter lock throughout, as
:mod:`~kdvfs.envs.env.observing.dynamic_observation` does.
"""

from __future__ import annotations

from kdvfs.common.arrays import Array
from kdvfs.common.compiled import compiled
from kdvfs.envs.env.observing.dynamic_observation import (
    L_BUDGET_PLAN,
    L_FITTING,
    L_FITTING_SLOT,
    L_LEVELS,
    L_MEMORIES,
    L_PLAN_SLOT,
    L_PLANS,
    L_PLANS_REST,
    observe_dynamic,
)
from kdvfs.envs.env.observing.live_tables import S_KERNELS
from kdvfs.envs.env.observing.observation import OBS_LIMIT, PLAN_ADVISOR_FEATURES, REMAINING_LATENCIES_CAP

EXISTS = PLAN_ADVISOR_FEATURES.index("exists")


@compiled
def budget_use_of(elapsed_s: float, model_elapsed_s: float, auto_elapsed_s: float,
                  drift_pct: float) -> tuple[float, float]:
    """(budget used (s, host), prediction error (a factor - 1)) of a measured state's times
    (:func:`~kdvfs.envs.env.observing.measured.budget_use`)."""
    error = elapsed_s / model_elapsed_s - 1.0 if model_elapsed_s > 0 and elapsed_s > 0 else 0.0
    return elapsed_s - auto_elapsed_s * (1.0 + drift_pct / 100.0) * (1.0 + error), error


@compiled
def residual_pair(pair: int, core_step: int, memory_step: int, levels: int, memories: int) -> int:
    """Grid pair ``pair`` moved ``core_step`` core levels (positive: lower clock; an auto core level stays
    auto, a locked one stays locked) and ``memory_step`` memory clocks (positive: lower), clipped to the grid."""
    level, memory = pair // memories, pair % memories
    if level > 0:
        level = min(max(level + core_step, 1), levels - 1)
    memory = min(max(memory + memory_step, 0), memories - 1)
    return level * memories + memory


@compiled
def _put(out: Array, index: int, value: float) -> int:
    """``out[index]`` = ``value`` clipped to the observation's limit (NaN stays NaN, as ``np.clip``); the next
    index."""
    if value > OBS_LIMIT:
        value = OBS_LIMIT
    elif value < -OBS_LIMIT:
        value = -OBS_LIMIT
    out[index] = value
    return index + 1


@compiled
def _latencies(time_s: float, latency_s: float) -> float:
    """``time_s`` in switching latencies, capped, over the cap (1: the cap or no latency)."""
    return min(time_s / latency_s if latency_s > 0 else REMAINING_LATENCIES_CAP,
               REMAINING_LATENCIES_CAP) / REMAINING_LATENCIES_CAP


@compiled
def _fitting_plan(advice: Array, lay: Array, pair: int, exists: float) -> int:
    """Which plan the fitting advisor follows (-1: none fits), as far as its pair tells: the first plan proposing
    it."""
    if exists == 0:
        return -1
    start = lay[L_PLAN_SLOT]
    for plan in range(lay[L_PLANS]):
        if advice[start + plan] == pair:
            return plan
    return -1


@compiled
def observe_residual(out: Array, obs: Array, advice: Array, static_rows: Array, lay: Array, advisor_index: Array,
                     cumulative_s: Array, landings: Array, plan_pairs: Array, plan_rest: Array, joinable: Array,
                     next_change: Array, speeds_up: Array, sizes: Array, auto_time_s: float, latency_s: float,
                     stall_s: float, budget: float, budget_plan: int, margin: float, errors: Array, kernel: int,
                     in_effect: int, pending: int, pending_age_s: float, elapsed_s: float, model_elapsed_s: float,
                     auto_elapsed_s: float, drift_pct: float, last_latency_ratio: float) -> int:
    """Write the residual policy's observation into ``out`` ((spec size,) float32: the entries of
    :data:`~kdvfs.envs.env.observing.measured.FEATURES` in order, then each plan's rest-of-step saving and
    slowdown) and return the fitting plan's pair, at a measured state (``kernel`` to ``last_latency_ratio``:
    :class:`~kdvfs.envs.env.observing.measured.MeasuredState`'s fields, host seconds) with ``budget``, its plan,
    ``margin`` of it held back (a share of the whole step's budget) and ``errors`` (the last decisions' prediction
    errors, %). The arguments before ``budget`` are :class:`~kdvfs.envs.env.observing.live_tables.LiveTables`'
    (without the proposal changes); its ``obs`` and ``advice`` buffers are written (the advisors' observation)."""
    kernels, plans = sizes[S_KERNELS], lay[L_PLANS]
    levels, memories = lay[L_LEVELS], lay[L_MEMORIES]
    k = min(max(kernel, 0), kernels - 1)
    scale = 1.0 + drift_pct / 100.0
    step_s = auto_time_s
    used_s, error = budget_use_of(elapsed_s, model_elapsed_s, auto_elapsed_s, drift_pct)
    used_model_s = used_s / (scale * (1.0 + error))
    held_budget = budget * (1.0 - margin)
    observe_dynamic(obs, advice, static_rows[k], lay, advisor_index, cumulative_s, landings[in_effect, 0],
                    landings[in_effect, 1], plan_pairs, plan_rest, joinable, next_change, speeds_up, k, in_effect,
                    pending, latency_s - pending_age_s / scale, elapsed_s / scale, auto_elapsed_s,
                    model_elapsed_s / scale, last_latency_ratio, drift_pct, held_budget, step_s, latency_s, stall_s,
                    budget_plan)
    fitting_start, budget_start = lay[L_FITTING], lay[L_BUDGET_PLAN]
    fitting_pair = advice[lay[L_FITTING_SLOT]]
    remaining_s = step_s - auto_elapsed_s
    affordable = 100.0 * (budget * step_s - used_model_s) / max(remaining_s, 1e-6 * step_s)
    effect = landings[in_effect, 0, k]
    fitting_plan = _fitting_plan(advice, lay, fitting_pair, obs[fitting_start + EXISTS])
    segment_end = next_change[effect, fitting_plan] if fitting_plan >= 0 else kernels
    segment_s = cumulative_s[segment_end, fitting_pair] - cumulative_s[effect, fitting_pair]
    level, memory = fitting_pair // memories, fitting_pair % memories
    level_now, memory_now = in_effect // memories, in_effect % memories
    i = _put(out, 0, 100.0 * budget)
    i = _put(out, i, used_model_s / (max(budget, 1e-3) * step_s))
    i = _put(out, i, affordable)
    i = _put(out, i, auto_elapsed_s / step_s)
    i = _put(out, i, _latencies(remaining_s, latency_s))
    i = _put(out, i, 1e3 * latency_s)
    i = _put(out, i, drift_pct)
    i = _put(out, i, 100.0 * error)
    for j in range(errors.shape[0]):
        i = _put(out, i, errors[j])
    i = _put(out, i, last_latency_ratio)
    i = _put(out, i, margin)
    i = _put(out, i, obs[fitting_start + 3])
    i = _put(out, i, obs[fitting_start])
    i = _put(out, i, obs[fitting_start + 1])
    i = _put(out, i, level / max(levels - 1, 1))
    i = _put(out, i, 1.0 if level == 0 else 0.0)
    i = _put(out, i, memory / max(memories - 1, 1))
    i = _put(out, i, _latencies(segment_s, latency_s))
    i = _put(out, i, obs[budget_start + 1])
    i = _put(out, i, level_now / max(levels - 1, 1))
    i = _put(out, i, 1.0 if level_now == 0 else 0.0)
    i = _put(out, i, memory_now / max(memories - 1, 1))
    i = _put(out, i, 1.0 if pending >= 0 else 0.0)
    rest = lay[L_PLANS_REST]
    for j in range(2 * plans):
        out[i + j] = obs[rest + j]
    return fitting_pair
