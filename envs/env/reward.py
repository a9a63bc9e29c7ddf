"""The reward of ``KernelDVFS-v0``: energy saved against auto, minus a penalty for time beyond the budget.

Per decision, over the kernels run since the previous one (:func:`reward_fn`):

    r = 100 * (E_auto - E) / E_auto_step  -  overrun_penalty * (overrun_after - overrun_before)
          [- violation_penalty at the episode's last decision if it ends over budget]
    overrun = max(0, 100 * (T - T_auto - budget * T_auto_step) / T_auto_step)

E, T: energy (stalls included) and elapsed time; E_auto, T_auto: auto mode on the same kernels (with the
episode's noise); E_auto_step, T_auto_step: the whole step in auto mode without noise. The penalty
telescopes, so an episode's return is its saving (% of the step's auto energy) minus ``overrun_penalty``
times its final overrun (%), minus ``violation_penalty`` if it overran at all: the linear term prices how
far over, the fixed one how often (the within-budget rate the evaluation reports).
"""

from __future__ import annotations

from typing import NamedTuple

from kdvfs.envs.env.config import EnvConfig


class Totals(NamedTuple):
    """What an episode has spent so far, and what auto mode spends on the same kernels (J, s)."""

    energy_j: float
    auto_energy_j: float
    elapsed_s: float
    auto_elapsed_s: float


class Reference(NamedTuple):
    """What the reward is relative to: the step in auto mode without noise (J, s) and the episode's budget
    (fraction of the step's auto time)."""

    step_auto_energy_j: float
    step_auto_time_s: float
    budget: float


def overrun_pct(totals: Totals, reference: Reference) -> float:
    """Time spent beyond the whole step's budget so far, in % of the step's auto time (0 within it)."""
    excess_s = totals.elapsed_s - totals.auto_elapsed_s - reference.budget * reference.step_auto_time_s
    return max(0.0, 100.0 * excess_s / reference.step_auto_time_s)


def reward_fn(before: Totals, after: Totals, reference: Reference, config: EnvConfig, final: bool = False
              ) -> tuple[float, dict[str, float]]:
    """The reward for going from ``before`` to ``after`` (see the module docstring; ``final``: the episode ends
    there) and its terms: ``reward_energy`` (energy saved over the stretch, % of the step's auto energy),
    ``reward_time`` (minus ``config.overrun_penalty`` times the overrun's increase, %) and
    ``reward_violation`` (minus ``config.violation_penalty`` if the episode ends over budget)."""
    energy_j, auto_energy_j = after.energy_j - before.energy_j, after.auto_energy_j - before.auto_energy_j
    reward_energy = 100.0 * (auto_energy_j - energy_j) / reference.step_auto_energy_j
    overrun_after = overrun_pct(after, reference)
    reward_time = -config.overrun_penalty * (overrun_after - overrun_pct(before, reference))
    reward_violation = -config.violation_penalty if final and overrun_after > 0 else 0.0
    return reward_energy + reward_time + reward_violation, {"reward_energy": reward_energy, "reward_time": reward_time,
                                                            "reward_violation": reward_violation}
