"""Residual PPO against the best fixed-margin fitting plan on held-out steps: within budget and saving per cell.

    python -m benchmarks.learned.learned_vs_plans [--gpus h200] [--seeds 4] [--jobs 2] [--name STEM]  # GPUs in turn

For each GPU with trained residual policies (``benchmarks/data/learned/<gpu>-s<seed>.kdvfs-policy.npz``: the
``ppo.kdvfs-policy.npz`` of each ``DIR/seed-S`` of ``kdvfs train --gpu G --config residual-G --seed 0 1 2 3 4 --out
DIR``): per
budget x latency cell, the fixed-margin fitting plan that saves most within budget on the validation pairs is
the bar; then the held-out pairs of ``benchmarks/learned/ppo_vs_clone.py`` are scored once for PPO of every
training seed and every fixed-margin plan. Two bounds are read off the held-out plans, never used for a choice:
the strongest fixed-margin plan (per cell, the margin saving the most among those within budget in >= 95% of
the held-out episodes: the best any fixed margin could do, chosen in hindsight) and the per-episode bound (each
episode's best margin within budget: what a margin adapted to each step could reach at most). Reported per
cell: within-budget share, mean saving, and PPO - plan and PPO - strongest plan saving with 95% intervals
clustered by family and training seed (two-way bootstrap). Writes
``benchmarks/results/learned_vs_plans.{json,md}`` (or ``--name``'s), every GPU of ``--gpus`` in one. Method:
``docs/design/benchmarks.md``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from benchmarks.common.provenance import provenance, write_results
from benchmarks.learned.ppo_vs_clone import held_out_pairs
from kdvfs.agents.learned.policy.frozen import FrozenPolicy
from kdvfs.agents.learned.policy.policy_planner import Actor
from kdvfs.agents.learned.training.margin_plans import (
    CELL_BUDGETS,
    CELL_LATENCY_SCALES,
    COMPLIANCE,
    best_margins,
    chosen,
    episodes,
    margin_actors,
    score_seeds,
    within,
)
from kdvfs.agents.learned.training.ppo import build_pairs, load_train_config
from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.observing.measured import margin_label
from kdvfs.envs.env.steps.shape_pairs import ShapePair
from kdvfs.envs.gpu.profiles import load_profile

POLICIES = REPO_ROOT / "benchmarks" / "data" / "learned"
BOOTSTRAP = 2000


def seed_policies(gpu: str) -> dict[int, FrozenPolicy]:
    """PPO's policy of every training seed for ``gpu``, by seed."""
    profile = load_profile(gpu)
    found = sorted(POLICIES.glob(f"{gpu}-s*.kdvfs-policy.npz"))
    return {int(path.name.split("-s")[-1].split(".")[0]): FrozenPolicy.load(path, profile) for path in found}


def clustered_interval(delta: np.ndarray, rng: np.random.Generator) -> list[float]:
    """95% interval of the mean of ``delta`` (families, seeds): a two-way bootstrap over families and seeds."""
    families, seeds = delta.shape
    means = [delta[np.ix_(rng.integers(families, size=families), rng.integers(seeds, size=seeds))].mean()
             for _ in range(BOOTSTRAP)]
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def actors_of(gpu: str, kind: str) -> dict[str, Actor]:
    """The fixed-margin plans (``kind`` "plans") or PPO of every training seed (``kind`` "ppo", by ``s<seed>``)."""
    return margin_actors() if kind == "plans" else {f"s{s}": p for s, p in seed_policies(gpu).items()}


def chunk_episodes(gpu: str, kind: str, pairs: list[ShapePair], config: EnvConfig, seeds: int) -> np.ndarray:
    """:func:`episodes` of :func:`actors_of` ``(gpu, kind)`` on ``pairs`` (what one process of the pool runs)."""
    return episodes(actors_of(gpu, kind), pairs, load_profile(gpu), config, seeds)


def pooled_episodes(pool: ProcessPoolExecutor, gpu: str, kind: str, pairs: list[ShapePair], config: EnvConfig,
                    seeds: int) -> np.ndarray:
    """:func:`chunk_episodes` of each pair on ``pool``, a pair a task, so that a free process takes the next (the
    real captures cost several times a generated pair; contiguous chunks left one process with most of the work).
    Each episode is seeded by its case: the figures do not depend on the split."""
    n = len(pairs)
    parts = pool.map(chunk_episodes, [gpu] * n, [kind] * n, [[pair] for pair in pairs], [config] * n, [seeds] * n)
    return np.concatenate(list(parts), axis=1)


def run_gpu(gpu: str, seeds: int, jobs: int) -> dict[str, Any]:
    """The comparison of the module docstring for one GPU, its episodes run in ``jobs`` processes."""
    with ProcessPoolExecutor(jobs) as pool:
        return _run_gpu(gpu, seeds, partial(pooled_episodes, pool, gpu))


def _run_gpu(gpu: str, seeds: int, run_episodes: Callable[..., np.ndarray]) -> dict[str, Any]:
    profile = load_profile(gpu)
    policies = seed_policies(gpu)
    config = next(iter(policies.values())).config if policies else load_train_config(f"residual-{gpu}").env
    grid = config.grid(profile)
    validation = build_pairs(load_train_config(f"residual-{gpu}").data.validation, profile, grid)
    margins = best_margins(run_episodes("plans", validation, config, score_seeds(validation)))
    labelled = held_out_pairs(gpu, profile, grid)
    pairs = [pair for _, pair in labelled]
    full = run_episodes("plans", pairs, config, seeds)
    bar, reference = chosen(full, margins), full[0]
    hindsight = best_margins(full)
    strongest = chosen(full, hindsight)
    bound = np.where(within(full) > 0, full[..., 0], -np.inf).max(axis=0)  # each episode's best margin
    if not policies:
        return baseline_only(gpu, margins, bar, reference, len(pairs), seeds)
    ppo = run_episodes("ppo", pairs, config, seeds)
    families = sorted({family for family, _ in labelled})
    member = np.array([[family == f for family, _ in labelled] for f in families])
    rng = np.random.default_rng(0)
    cells = []
    for b, budget in enumerate(CELL_BUDGETS):
        for s, scale in enumerate(CELL_LATENCY_SCALES):
            mine, plan, plain = ppo[:, :, b, s], bar[:, b, s], reference[:, b, s]
            delta = family_seed_means(mine[..., 0] - plan[None, ..., 0], member)
            delta_strongest = family_seed_means(mine[..., 0] - strongest[None, :, b, s, :, 0], member)
            cells.append({
                "budget_pct": 100 * budget, "latency_scale": scale, "margin": margin_label(int(margins[b, s])),
                "margin_strongest": margin_label(int(hindsight[b, s])),
                "within_budget_ppo": float(within(ppo[:, :, b:b + 1, s:s + 1], (budget,)).mean()),
                "within_budget_ppo_by_seed":
                    within(ppo[:, :, b:b + 1, s:s + 1], (budget,)).mean(axis=(1, 2, 3, 4)).tolist(),
                "within_budget_plan": float(within(bar[:, b:b + 1, s:s + 1], (budget,)).mean()),
                "within_budget_strongest_plan": float(within(strongest[:, b:b + 1, s:s + 1], (budget,)).mean()),
                "within_budget_reference_plan": float(within(reference[:, b:b + 1, s:s + 1], (budget,)).mean()),
                "saved_ppo_pct": float(mine[..., 0].mean()), "saved_plan_pct": float(plan[..., 0].mean()),
                "saved_strongest_plan_pct": float(strongest[:, b, s, :, 0].mean()),
                "saved_per_episode_bound_pct": float(bound[:, b, s].mean()),
                "saved_reference_plan_pct": float(plain[..., 0].mean()),
                "ppo_minus_plan_pct": float(delta.mean()), "ci95": clustered_interval(delta, rng),
                "ppo_minus_strongest_plan_pct": float(delta_strongest.mean()),
                "ci95_strongest": clustered_interval(delta_strongest, rng)})
    delta_all = family_seed_means(ppo[..., 0] - bar[None, ..., 0], member)
    delta_strongest_all = family_seed_means(ppo[..., 0] - strongest[None, ..., 0], member)
    summary = {"trained": True, "seeds": sorted(policies), "families": families, "pairs": len(pairs),
               "noise_seeds": seeds, "ppo_minus_plan_pct": float(delta_all.mean()),
               "ci95": clustered_interval(delta_all, rng),
               "ppo_minus_strongest_plan_pct": float(delta_strongest_all.mean()),
               "ci95_strongest": clustered_interval(delta_strongest_all, rng),
               "within_budget_ppo": float(within(ppo).mean()), "within_budget_plan": float(within(bar).mean()),
               "within_budget_strongest_plan": float(within(strongest).mean()),
               "within_budget_reference_plan": float(within(reference).mean()),
               "saved_per_episode_bound_pct": float(bound.mean()),
               "cells_ppo_within_95": sum(c["within_budget_ppo"] >= COMPLIANCE for c in cells),
               "cells_plan_within_95": sum(c["within_budget_plan"] >= COMPLIANCE for c in cells),
               "cells_ppo_saves_more_ci_above_0": sum(c["ci95"][0] > 0 for c in cells),
               "cells_ppo_saves_more_than_strongest_ci_above_0": sum(c["ci95_strongest"][0] > 0 for c in cells),
               "cells": cells, "by_drift": by_drift(ppo, strongest, member, rng),
               "policy_revisions": sorted({str(p.meta.get("git_revision")) for p in policies.values()})}
    return summary


def family_seed_means(delta: np.ndarray, member: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """(families, seeds) mean of ``delta`` (seeds, pairs, ...) over each family's pairs (``member`` (families,
    pairs) bool) and the remaining axes; ``mask`` (pairs, ...) bool: only those episodes (None: all)."""
    keep = np.ones(delta.shape[1:], dtype=bool) if mask is None else mask
    return np.array([[delta[k][member[f]][keep[member[f]]].mean() for k in range(delta.shape[0])]
                     for f in range(len(member))])


def by_drift(ppo: np.ndarray, strongest: np.ndarray, member: np.ndarray, rng: np.random.Generator
             ) -> list[dict[str, Any]]:
    """PPO against the strongest plan in the held-out episodes below and above the median of auto's drift at
    their start (the environment's modelled drift: a locked clock below the limiter gains it on auto for free).
    ``ppo`` (seeds, pairs, budgets, latencies, noise seeds, 3), ``strongest`` the same without seeds."""
    drift, kept = strongest[..., 2], within(ppo)
    median = float(np.median(drift))
    halves = []
    for name, mask in (("below", drift <= median), ("above", drift > median)):
        delta = family_seed_means(ppo[..., 0] - strongest[None, ..., 0], member, mask)
        halves.append({"drift": name, "median_drift_pct": median, "episodes": int(mask.sum()),
                       "saved_ppo_pct": float(ppo[..., 0][:, mask].mean()),
                       "saved_strongest_plan_pct": float(strongest[..., 0][mask].mean()),
                       "within_budget_ppo": float(kept[:, mask].mean()),
                       "ppo_minus_strongest_plan_pct": float(delta.mean()), "ci95": clustered_interval(delta, rng)})
    return halves


def baseline_only(gpu: str, margins: np.ndarray, bar: np.ndarray, reference: np.ndarray, pairs: int,
                  seeds: int) -> dict[str, Any]:
    """The bar's figures for a GPU without trained residual policies (``trained`` False)."""
    cells: list[dict[str, Any]] = [{"budget_pct": 100 * budget, "latency_scale": scale,
                                    "margin": margin_label(int(margins[b, s])),
                      "within_budget_plan": float(within(bar[:, b:b + 1, s:s + 1], (budget,)).mean()),
                      "within_budget_reference_plan": float(within(reference[:, b:b + 1, s:s + 1], (budget,)).mean()),
                      "saved_plan_pct": float(bar[:, b, s, :, 0].mean()),
                      "saved_reference_plan_pct": float(reference[:, b, s, :, 0].mean())}
                     for b, budget in enumerate(CELL_BUDGETS) for s, scale in enumerate(CELL_LATENCY_SCALES)]
    return {"trained": False, "gpu": gpu, "pairs": pairs, "noise_seeds": seeds,
            "within_budget_plan": float(within(bar).mean()),
            "within_budget_reference_plan": float(within(reference).mean()),
            "cells_plan_within_95": sum(c["within_budget_plan"] >= COMPLIANCE for c in cells), "cells": cells}


def drift_lines(halves: list[dict[str, Any]]) -> list[str]:
    """The :func:`by_drift` halves as markdown lines (before the cells' table)."""
    lines = [f"By auto's drift at the episode's start (modelled; split at the held-out median, "
             f"{halves[0]['median_drift_pct']:.2f}%):", ""]
    lines += [f"- drift {h['drift']} the median ({h['episodes']} cases): saved PPO {h['saved_ppo_pct']:.2f}% / "
              f"strongest plan {h['saved_strongest_plan_pct']:.2f}%, PPO within budget {h['within_budget_ppo']:.1%}, "
              f"PPO - strongest {h['ppo_minus_strongest_plan_pct']:+.3f} [{h['ci95'][0]:+.3f}, {h['ci95'][1]:+.3f}]"
              for h in halves]
    return [*lines, ""]


def _markdown(result: dict[str, Any]) -> str:
    lines = ["# Residual PPO against the best fixed-margin fitting plan (held-out steps)", "",
             *[f"- {k}: `{v}`" if k != "figure" else f"- figure: {v}" for k, v in result["provenance"].items()], ""]
    for gpu, row in result["gpus"].items():
        if not row["trained"]:
            lines += [f"## {gpu} (the bar only: no residual policy trained)", "",
                      f"{row['pairs']} held-out pairs, {row['noise_seeds']} noise seeds; within budget: best "
                      f"fixed-margin plan {row['within_budget_plan']:.1%}, fitting plan (no margin) "
                      f"{row['within_budget_reference_plan']:.1%}; cells >= 95%: {row['cells_plan_within_95']}/9.", "",
                      "| budget | latency | margin (validation) | within plan / no margin "
                      "| saved plan / no margin (%) |",
                      "| --- | --- | --- | --- | --- |"]
            lines += [f"| {c['budget_pct']:g}% | {c['latency_scale']:g}x | {c['margin']} | "
                      f"{c['within_budget_plan']:.1%} / {c['within_budget_reference_plan']:.1%} | "
                      f"{c['saved_plan_pct']:.2f} / {c['saved_reference_plan_pct']:.2f} |" for c in row["cells"]]
            lines.append("")
            continue
        lo, hi = row["ci95"]
        lines += [f"## {gpu}", "",
                  f"Training seeds {row['seeds']}; {row['pairs']} held-out pairs of {', '.join(row['families'])}; "
                  f"{row['noise_seeds']} noise seeds. PPO - plan saving {row['ppo_minus_plan_pct']:+.3f} points "
                  f"[{lo:+.3f}, {hi:+.3f}] (family x seed clustered); PPO - strongest plan "
                  f"{row['ppo_minus_strongest_plan_pct']:+.3f} [{row['ci95_strongest'][0]:+.3f}, "
                  f"{row['ci95_strongest'][1]:+.3f}]; within budget PPO {row['within_budget_ppo']:.1%}, plan "
                  f"{row['within_budget_plan']:.1%}, strongest plan {row['within_budget_strongest_plan']:.1%}, "
                  f"fitting plan (no margin) {row['within_budget_reference_plan']:.1%}; cells >= 95% within budget: "
                  f"PPO {row['cells_ppo_within_95']}/9, plan {row['cells_plan_within_95']}/9; per-episode bound "
                  f"{row['saved_per_episode_bound_pct']:.2f}% saved.", "",
                  "Plan: chosen on validation; strongest: the best fixed margin within budget in >= 95% of the "
                  "held-out episodes (hindsight); bound: each episode's best margin within budget (hindsight).", "",
                  "| budget | latency | margin plan / strongest | within PPO / plan / strongest / no margin "
                  "| saved PPO / plan / strongest / no margin / bound (%) | PPO - plan (95%, clustered) "
                  "| PPO - strongest (95%) |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for c in row["cells"]:
            lo, hi = c["ci95"]
            los, his = c["ci95_strongest"]
            lines.append(f"| {c['budget_pct']:g}% | {c['latency_scale']:g}x | {c['margin']} / "
                         f"{c['margin_strongest']} | {c['within_budget_ppo']:.1%} / {c['within_budget_plan']:.1%} / "
                         f"{c['within_budget_strongest_plan']:.1%} / {c['within_budget_reference_plan']:.1%} | "
                         f"{c['saved_ppo_pct']:.2f} / {c['saved_plan_pct']:.2f} / {c['saved_strongest_plan_pct']:.2f}"
                         f" / {c['saved_reference_plan_pct']:.2f} / {c['saved_per_episode_bound_pct']:.2f} | "
                         f"{c['ppo_minus_plan_pct']:+.3f} [{lo:+.3f}, {hi:+.3f}] | "
                         f"{c['ppo_minus_strongest_plan_pct']:+.3f} [{los:+.3f}, {his:+.3f}] |")
        lines += ["", *drift_lines(row["by_drift"])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", nargs="+", default=["h200", "b200", "a100-sxm4"])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=2, help="processes running a GPU's episodes")
    parser.add_argument("--name", default="learned_vs_plans", help="results file stem (benchmarks/results/NAME.*)")
    args = parser.parse_args()
    runs = {gpu: run_gpu(gpu, args.seeds, args.jobs) for gpu in args.gpus}
    command = (f"python -m benchmarks.learned.learned_vs_plans --gpus {' '.join(args.gpus)} --seeds {args.seeds}"
               + ("" if args.name == "learned_vs_plans" else f" --name {args.name}"))
    result = {"provenance": provenance(command), "gpus": runs}
    write_results(args.name, result, _markdown(result))


if __name__ == "__main__":
    main()
