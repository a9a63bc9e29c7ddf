"""The observation's dynamic part, compiled: what a decision point adds to its step's static row.

Everything of the observation that depends on where the run stands (clocks in effect and pending, the budget
and conditions, the window and plan advisors' picks) is written by :func:`observe_dynamic`, a numba function
compiled once (cached beside this file), through :func:`~kdvfs.envs.env.observing.live_tables.observe_at`: the
observation the environment and a controller's live decisions both make, in a few microseconds. It keeps the
interpreter lock throughout, as
:mod:`kdvfs.agents.learned.policy.forward` does: letting go of it beside a busy training thread risks waiting up to
the switch interval (5 ms) to get it back. The arithmetic is
the environment's (float64 where Python computed in floats; comparisons with float32 entries in float32, as
numpy compares a float32 array with a Python float), so observations are the same bit for bit.

:func:`layout` packs the block offsets, sizes and advisor slots of an
:class:`~kdvfs.envs.env.observing.observation.ObservationSpec` into one int64 array, read by the ``L_*`` indices.
"""

from __future__ import annotations

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.compiled import compiled
from kdvfs.envs.env.observing.observation import (
    ADVISOR_FEATURES,
    OBS_LIMIT,
    REMAINING_LATENCIES_CAP,
    WINDOW_METRICS,
    ObservationSpec,
)

(L_WINDOWS, L_WINDOW_COUNT, L_PAIRS, L_LEVELS, L_MEMORIES, L_KERNELS, L_PLANS, L_IN_EFFECT, L_PENDING,
 L_CONTROLLER, L_BUDGET, L_CONDITIONS, L_ADVISORS, L_PLANS_REST, L_PLANS_IN_EFFECT, L_FITTING, L_BUDGET_PLAN,
 L_WINDOW_SLOT, L_PLAN_SLOT, L_FITTING_SLOT, L_BUDGET_SLOT) = range(21)
"""Entries of :func:`layout`: block offsets into the observation, sizes, advisor slots."""
SLOWDOWN, SAVING = WINDOW_METRICS.index("slowdown_pct"), WINDOW_METRICS.index("saving_pct")
IN_EFFECT_FEATURE = ADVISOR_FEATURES.index("in_effect")
OWN_FEATURES = len(ADVISOR_FEATURES) - 1
"""The window advisors' features read from the window block (all but ``in_effect``, which comes last)."""
assert IN_EFFECT_FEATURE == OWN_FEATURES


def layout(spec: ObservationSpec, kernels: int) -> Array:
    """(21,) int64: ``spec``'s block offsets, sizes and advisor slots for a step of ``kernels`` kernels."""
    _, windows, pairs = spec.shape("window_slowdown_then_saving_pct")
    slots = spec.advisor_slots()
    starts = {name: spec.span(name).start for name, _ in spec.blocks()}
    return np.array([
        starts["window_slowdown_then_saving_pct"], windows, pairs, spec.grid.levels, len(spec.grid.memory_mhz),
        kernels, len(spec.plan_budgets), starts["clocks_in_effect"], starts["clocks_pending"], starts["controller"],
        starts["budget"], starts["conditions"], starts["advisors"], starts["plans_rest_saving_then_slowdown_pct"],
        starts["plans_in_effect"], starts["fitting_plan"], starts["budget_plan"], slots["windows"].start,
        slots["plans"].start, slots["fitting_plan"].start, slots["budget_plan"].start], dtype=np.int64)


@compiled
def _clip(value: float) -> float:
    return min(OBS_LIMIT, max(-OBS_LIMIT, value))


@compiled
def _one_hot(obs: Array, start: int, action: int, memories: int, levels: int) -> None:
    """Grid action ``action``'s core level and memory clock one-hot at ``obs[start:]`` (C + M; zeros for -1)."""
    obs[start:start + levels + memories] = 0.0
    if action >= 0:
        obs[start + action // memories] = 1.0
        obs[start + levels + action % memories] = 1.0


def clock_one_hots(levels: int, memories: int) -> Array:
    """(G + 1, C + M) float32: the ``clocks_in_effect`` / ``clocks_pending`` block of no pair (row 0) and of
    each grid pair ``g`` (row ``g + 1``), as :func:`observe_dynamic` writes it."""
    blocks = np.zeros((levels * memories + 1, levels + memories), dtype=np.float32)
    for pair in range(-1, levels * memories):
        _one_hot(blocks[pair + 1], 0, pair, memories, levels)
    return blocks


@compiled
def _window_advisors(obs: Array, advice: Array, row: Array, lay: Array, advisor_index: Array, in_effect: int,
                     affordable: float) -> None:
    """Each window advisor's pick (the pair saving the most over its window among those whose slowdown fits
    ``affordable``, at least 0; ties to the lowest pair; pair 0 when none fits) and its features."""
    windows, pairs, start = lay[L_WINDOW_COUNT], lay[L_PAIRS], lay[L_WINDOWS]
    slowdowns, savings = start + SLOWDOWN * windows * pairs, start + SAVING * windows * pairs
    limit = np.float32(max(affordable, 0.0))
    for w in range(windows):
        best, best_saving = 0, -np.inf
        for g in range(pairs):
            if row[slowdowns + w * pairs + g] <= limit and row[savings + w * pairs + g] > best_saving:
                best, best_saving = g, row[savings + w * pairs + g]
        advice[lay[L_WINDOW_SLOT] + w] = best
        for feature in range(OWN_FEATURES):
            obs[lay[L_ADVISORS] + feature * windows + w] = row[start + advisor_index[feature, w] + best]
        obs[lay[L_ADVISORS] + IN_EFFECT_FEATURE * windows + w] = 1.0 if best == in_effect else 0.0


@compiled
def _plan_advisor(obs: Array, advice: Array, lay: Array, start: int, slot: int, plan: int, in_effect: int) -> None:
    """Advisor ``slot`` proposes plan ``plan``'s pair (auto if -1); its features at ``obs[start:]`` (the plans'
    pairs already in ``advice``, their rest-of-step figures in the observation)."""
    if plan < 0:
        advice[slot] = 0
        obs[start], obs[start + 1] = 0.0, 0.0
        obs[start + 2] = 1.0 if in_effect == 0 else 0.0
        obs[start + 3] = 0.0
    else:
        pair, rest = advice[lay[L_PLAN_SLOT] + plan], lay[L_PLANS_REST]
        advice[slot] = pair
        obs[start], obs[start + 1] = obs[rest + plan], obs[rest + lay[L_PLANS] + plan]
        obs[start + 2] = 1.0 if pair == in_effect else 0.0
        obs[start + 3] = 1.0


@compiled
def _plan_advisors(obs: Array, advice: Array, lay: Array, cumulative_s: Array, effect: int, next_effect: int,
                   plan_pairs: Array, plan_rest: Array, joinable: Array, next_change: Array, speeds_up: Array,
                   k: int, in_effect: int, used_s: float, budget: float, auto_time_s: float,
                   stall_s: float, budget_plan: int) -> None:
    """Each plan's pair where a request made now takes effect (kernel ``effect``; the pair after its next
    change if that speeds up and a request at the next decision point, landing at ``next_effect``, would be
    late for it), its rest-of-step figures and whether it is in effect; then the fitting plan (saving the most
    among the followable plans whose slowdown fits what is affordable from ``effect``, once the kernels until
    then ran at the clocks in effect and, for a plan whose pair is not in effect, the stall of joining it after
    the first decision) and the budget's plan."""
    plans, rest, flags = lay[L_PLANS], lay[L_PLANS_REST], lay[L_PLANS_IN_EFFECT]
    for p in range(plans):
        change = next_change[effect, p]
        early = speeds_up[effect, p] and change < next_effect
        pair = plan_pairs[change, p] if early else plan_pairs[effect, p]
        advice[lay[L_PLAN_SLOT] + p] = pair
        obs[flags + p] = 1.0 if pair == in_effect else 0.0
    for j in range(2 * plans):
        obs[rest + j] = plan_rest[effect, j]
    auto_at_effect = cumulative_s[effect, 0]
    committed_s = cumulative_s[effect, in_effect] - cumulative_s[k, in_effect]
    auto_until_effect_s = auto_at_effect - cumulative_s[k, 0]
    used_then_s = used_s + committed_s - auto_until_effect_s
    rest_s = max(auto_time_s - auto_at_effect, 1e-6 * auto_time_s)
    affordable = 100.0 * (budget * auto_time_s - used_then_s) / rest_s
    join_stall_s = 0.0 if k == 0 else stall_s  # the first decision's clocks are in effect from the start
    limit = np.float32(max(affordable, 0.0))
    join_limit = np.float32(max(affordable - 100.0 * join_stall_s / rest_s, 0.0))
    fitting, best_saving = -1, -np.inf
    for p in range(plans):
        in_place = obs[flags + p] != 0.0
        followable = in_place or joinable[effect, p]
        fits = obs[rest + plans + p] <= (limit if in_place else join_limit)
        if followable and fits and (fitting < 0 or obs[rest + p] > best_saving):
            fitting, best_saving = p, obs[rest + p]
    _plan_advisor(obs, advice, lay, lay[L_FITTING], lay[L_FITTING_SLOT], fitting, in_effect)
    _plan_advisor(obs, advice, lay, lay[L_BUDGET_PLAN], lay[L_BUDGET_SLOT], budget_plan, in_effect)


@compiled
def observe_dynamic(obs: Array, advice: Array, row: Array, lay: Array, advisor_index: Array, cumulative_s: Array,
                    effect: Array, next_effect: Array, plan_pairs: Array, plan_rest: Array, joinable: Array,
                    next_change: Array, speeds_up: Array, k: int, in_effect: int, pending: int,
                    pending_left_s: float, elapsed_s: float, auto_elapsed_s: float, model_elapsed_s: float,
                    last_latency_ratio: float, drift_pct: float, budget: float, auto_time_s: float,
                    latency_s: float, stall_s: float, budget_plan: int) -> None:
    """Write the dynamic blocks of the observation at kernel ``k`` into ``obs`` (N,) float32 and each advisor's
    pair into ``advice`` (A,) int64 (the ``KernelDVFS-v0`` docstring's blocks; ``docs/design/environment.md``).

    Args:
        row: the step's static row at ``k`` ((static size,) float32: next kernels, windows).
        lay: :func:`layout`; advisor_index: :func:`~kdvfs.envs.env.observing.observation.advisor_index`.
        cumulative_s: (K + 1, G) float64 kernel start times at each pair (model s).
        effect, next_effect: (K + 1,) int64 landing kernels on the timeline of the pair in effect
            (:func:`~kdvfs.envs.env.advice.plan_advice.landing_kernels`).
        plan_pairs, plan_rest, joinable, next_change, speeds_up: the step's
            :class:`~kdvfs.envs.env.advice.plan_advice.PlanAdvice` tables.
        k, in_effect, pending: the kernel, grid pair in effect, pair pending (-1: none).
        pending_left_s: time until the pending change is expected to take effect (s; may be negative).
        elapsed_s, auto_elapsed_s, model_elapsed_s: the step's time so far, the prediction's for the same
            kernels at auto and at the clocks they ran at (s; :class:`~kdvfs.envs.env.observing.live.LiveState`).
        last_latency_ratio, drift_pct: the conditions' measured entries.
        budget: allowed step-time increase over auto (fraction); auto_time_s: the step's auto time (s);
            latency_s: mean switching latency (s); stall_s: GPU stall per clock change (s); budget_plan: the
            budget's plan (-1: none).
    """
    levels, memories = lay[L_LEVELS], lay[L_MEMORIES]
    _one_hot(obs, lay[L_IN_EFFECT], in_effect, memories, levels)
    _one_hot(obs, lay[L_PENDING], pending, memories, levels)
    c = lay[L_CONTROLLER]
    obs[c] = max(0.0, pending_left_s) / latency_s if pending >= 0 and latency_s > 0 else 0.0
    obs[c + 1] = 0.0 if pending >= 0 else 1.0
    obs[c + 2] = 1.0 if k == 0 or latency_s <= 0 else 0.0
    c = lay[L_CONDITIONS]
    run_pct = 100.0 * (elapsed_s / auto_elapsed_s - 1.0) if auto_elapsed_s > 0 else 0.0
    error_scale = _error_scale(elapsed_s, model_elapsed_s)
    obs[c], obs[c + 1], obs[c + 2], obs[c + 3] = 1e3 * latency_s, drift_pct, _clip(run_pct), last_latency_ratio
    obs[c + 4] = _clip(100.0 * (error_scale - 1.0))
    expected_s = cumulative_s[min(k, lay[L_KERNELS]), 0]
    used_s, remaining_s = elapsed_s - auto_elapsed_s * error_scale, auto_time_s - expected_s
    affordable = 100.0 * (budget * auto_time_s - used_s) / max(remaining_s, 1e-6 * auto_time_s)
    latencies = remaining_s / latency_s if latency_s > 0 else REMAINING_LATENCIES_CAP
    c = lay[L_BUDGET]
    obs[c], obs[c + 1] = 100.0 * budget, _clip(used_s / (max(budget, 1e-3) * auto_time_s))
    obs[c + 2], obs[c + 3] = _clip(affordable), expected_s / auto_time_s
    obs[c + 4] = min(latencies, REMAINING_LATENCIES_CAP) / REMAINING_LATENCIES_CAP
    _window_advisors(obs, advice, row, lay, advisor_index, in_effect, affordable)
    observe_plans(obs, advice, lay, cumulative_s, effect, next_effect, plan_pairs, plan_rest, joinable, next_change,
                  speeds_up, k, in_effect, elapsed_s, auto_elapsed_s, model_elapsed_s, budget, auto_time_s, stall_s,
                  budget_plan)


@compiled
def _error_scale(elapsed_s: float, model_elapsed_s: float) -> float:
    """The prediction error (elapsed over the prediction's time at the clocks run): it scales the prediction's
    auto time before it is subtracted, so a step longer than predicted at every clock is not budget used."""
    return elapsed_s / model_elapsed_s if model_elapsed_s > 0 else 1.0


@compiled
def observe_plans(obs: Array, advice: Array, lay: Array, cumulative_s: Array, effect: Array, next_effect: Array,
                  plan_pairs: Array, plan_rest: Array, joinable: Array, next_change: Array, speeds_up: Array, k: int,
                  in_effect: int, elapsed_s: float, auto_elapsed_s: float, model_elapsed_s: float, budget: float,
                  auto_time_s: float, stall_s: float, budget_plan: int) -> None:
    """:func:`observe_dynamic`'s plan advisors alone: the plans', the fitting plan's and the budget plan's pairs
    into ``advice`` and their blocks into ``obs``, as :func:`observe_dynamic` writes them at the same state (the
    same arguments; what the plans propose depends on nothing else of it), for a caller that reads no more (a
    budget-dependent order's proposal read ahead, state by state)."""
    used_s = elapsed_s - auto_elapsed_s * _error_scale(elapsed_s, model_elapsed_s)
    _plan_advisors(obs, advice, lay, cumulative_s, effect[k], next_effect[k], plan_pairs, plan_rest, joinable,
                   next_change, speeds_up, k, in_effect, used_s, budget, auto_time_s, stall_s, budget_plan)
