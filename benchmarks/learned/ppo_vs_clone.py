"""PPO against its clone on held-out steps of shapes never captured: which one ships, with its interval.

    python -m benchmarks.learned.ppo_vs_clone [--gpus h200 b200] [--seeds 16] [--jobs 2]

For every GPU with both candidates of one training run (``benchmarks/data/{ppo,imitation}/<gpu>.kdvfs-policy.npz``),
the held-out pairs (:mod:`kdvfs.envs.env.steps.shape_pairs`; on the H200 also its real captures of three families),
none in training, at budgets 0.5/1/2% and three switching latencies, ``--seeds`` paired seeds: ``ppo``,
``clone``, the reference plan, the oracle, and both policies with drift off. Intervals are t intervals over
seeds. Writes ``benchmarks/results/ppo_vs_clone.{json,md}`` (``{"gpus": {GPU: {"delta_saved_pct", "ci95",
...}}}``). Method: ``docs/design/benchmarks.md``.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
from scipy import stats

from benchmarks.common.provenance import provenance, write_results
from benchmarks.model.step_model import FAMILIES, family_traces
from kdvfs.agents.common.problem import within_budget
from kdvfs.agents.learned.policy.frozen import FrozenPolicy
from kdvfs.agents.learned.policy.policy_planner import Actor, rollout
from kdvfs.agents.learned.training.imitation import Expert
from kdvfs.agents.learned.training.ppo import load_train_config
from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.steps.shape_pairs import Perturbation, ShapePair, shape_pairs
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile

GPUS = ("h200", "b200", "a100-sxm4", "h100-sxm", "rtx3080ti")
BUDGETS = (0.005, 0.01, 0.02)
LATENCY_SCALES = (0.0, 1.0, 2.0)
CANDIDATES = REPO_ROOT / "benchmarks" / "data"
METHODS = ("ppo", "clone", "reference-plan", "oracle", "ppo-drift-off", "clone-drift-off")
ORACLE_SHARE = 0.8


def candidate(gpu: str, kind: str, profile: GpuProfile) -> FrozenPolicy:
    """The training run's ``kind`` policy (``ppo`` or ``imitation``) for ``gpu``."""
    return FrozenPolicy.load(CANDIDATES / kind / f"{gpu}.kdvfs-policy.npz", profile)


def held_out_pairs(gpu: str, profile: GpuProfile, grid: Any) -> list[tuple[str, ShapePair]]:
    """(family, pair) of every held-out pair of ``gpu`` (module docstring)."""
    shapes = load_train_config(gpu).data.held_out.shapes
    assert shapes is not None, f"configs/ppo/{gpu}.yaml has no held-out shapes"
    out = []
    for workload in shapes.workloads:
        traces = shapes.family(workload, profile)
        out += [(workload, p) for p in shape_pairs(traces, shapes.reference_indices(len(traces)), shapes.variants,
                                                   shapes.perturbation, profile, grid, shapes.seed)]
    if gpu == "h200":
        for family in FAMILIES:
            out += [(f"{family} (real)", p) for p in shape_pairs(family_traces(family), None, 1, Perturbation(),
                                                                  profile, grid)]
    return out


def _episode(actor: Actor, env: KernelDVFSEnv, options: dict[str, Any], seed: int) -> tuple[float, float]:
    summary = rollout(actor, env, options, seed)
    return float(summary["energy_saved_pct"]), float(summary["slowdown_pct"])


def _pair_results(pair: ShapePair, policies: dict[str, FrozenPolicy], profile: GpuProfile, config: EnvConfig,
                  seeds: int) -> np.ndarray:
    """(budgets, latencies, seeds, methods, 2) saving and slowdown (%) of every method on one pair."""
    out = np.zeros((len(BUDGETS), len(LATENCY_SCALES), seeds, len(METHODS), 2))
    envs = {drift: KernelDVFSEnv([pair.predicted], profile, config.replace(drift=drift)) for drift in (True, False)}
    oracles = [KernelDVFSEnv([view], profile, config) for view in pair.executed]
    actors: dict[str, tuple[Actor, KernelDVFSEnv]] = {
        "ppo": (policies["ppo"], envs[True]), "clone": (policies["imitation"], envs[True]),
        "reference-plan": (Expert(envs[True], "fitting_plan"), envs[True]),
        "ppo-drift-off": (policies["ppo"], envs[False]), "clone-drift-off": (policies["imitation"], envs[False])}
    for b, budget in enumerate(BUDGETS):
        for s, scale in enumerate(LATENCY_SCALES):
            for seed in range(seeds):
                view = seed % len(pair.executed)
                options = {"step": 0, "budget": budget, "latency_scale": scale, "executed": pair.executed[view]}
                for m, method in enumerate(METHODS):
                    if method == "oracle":
                        oracle = oracles[view]
                        out[b, s, seed, m] = _episode(Expert(oracle, "budget_plan"), oracle,
                                                      {"step": 0, "budget": budget, "latency_scale": scale}, seed)
                    else:
                        actor, env = actors[method]
                        out[b, s, seed, m] = _episode(actor, env, options, seed)
    return out


def _interval(per_seed: np.ndarray) -> list[float]:
    """95% t interval of the mean of per-seed values."""
    mean, half = float(per_seed.mean()), float(stats.t.ppf(0.975, len(per_seed) - 1) * per_seed.std(ddof=1)
                                               / np.sqrt(len(per_seed)))
    return [mean - half, mean + half]


def _within(results: np.ndarray, method: str, budgets: tuple[float, ...] = BUDGETS) -> float:
    """Share of ``method``'s episodes within their budget; ``results`` (P, budgets, latencies, seeds, M, 2) over
    ``budgets``."""
    slowdown = results[..., METHODS.index(method), 1]
    limits = np.broadcast_to(np.array(budgets)[None, :, None, None], slowdown.shape)
    return float(np.mean([within_budget(float(x), float(b)) for x, b in
                          zip(slowdown.ravel(), limits.ravel(), strict=True)]))


def _delta(results: np.ndarray, a: str, b: str) -> tuple[float, list[float]]:
    """Mean saving of ``a`` minus ``b`` (points) and its 95% interval over seeds."""
    diff = results[..., METHODS.index(a), 0] - results[..., METHODS.index(b), 0]
    per_seed = diff.mean(axis=(0, 1, 2))
    return float(diff.mean()), _interval(per_seed)


def _latency_rows(results: np.ndarray) -> list[dict[str, Any]]:
    """Per switching latency: every method's mean saving and share within budget, PPO against
    reference-plan (with interval) and PPO's share of the oracle's saving."""
    rows = []
    for s, scale in enumerate(LATENCY_SCALES):
        part = results[:, :, s:s + 1]
        methods = {m: {"energy_saved_pct": float(part[..., i, 0].mean()), "within_budget": _within(part, m)}
                   for i, m in enumerate(METHODS)}
        delta, ci = _delta(part, "ppo", "reference-plan")
        oracle = methods["oracle"]["energy_saved_pct"]
        rows.append({"latency_scale": scale, "methods": methods, "ppo_minus_reference_plan_pct": delta,
                     "ppo_minus_reference_plan_ci95": ci,
                     "ppo_share_of_oracle": methods["ppo"]["energy_saved_pct"] / oracle if oracle > 0 else None})
    return rows


def run_gpu(gpu: str, seeds: int) -> dict[str, Any]:
    """Every held-out pair of ``gpu`` under every method (module docstring)."""
    profile = load_profile(gpu)
    policies = {kind: candidate(gpu, kind, profile) for kind in ("ppo", "imitation")}
    config = policies["ppo"].config
    assert config == policies["imitation"].config, "the candidates come from different training configs"
    config = config.with_disturbances().replace(run_steps=1, budgets=BUDGETS, latency_scales=LATENCY_SCALES)
    pairs = held_out_pairs(gpu, profile, policies["ppo"].grid(profile))
    results = np.stack([_pair_results(p, policies, profile, config, seeds) for _, p in pairs])
    delta, ci = _delta(results, "ppo", "clone")
    drift_off, drift_off_ci = _delta(results, "ppo-drift-off", "clone-drift-off")
    summary = {"delta_saved_pct": delta, "ci95": ci, "pairs": int(results[..., 0, 0].size),
               "within_budget_ppo": _within(results, "ppo"),
               "within_budget_clone": _within(results, "clone"),
               "drift_off_delta_saved_pct": drift_off}
    by_budget = []
    for b, budget in enumerate(BUDGETS):
        part = results[:, b:b + 1]
        row_delta, row_ci = _delta(part, "ppo", "clone")
        by_budget.append({"budget_pct": 100 * budget, "ppo_minus_clone_pct": row_delta, "ci95": row_ci,
                          "within_budget_ppo": _within(part, "ppo", (budget,)),
                          "within_budget_clone": _within(part, "clone", (budget,))})
    families = sorted({f for f, _ in pairs})
    detail = {"drift_off_ci95": drift_off_ci, "seeds": seeds, "steps": len(pairs), "families": families,
              "selected": policies["ppo"].meta.get("selected"), "by_latency": _latency_rows(results),
              "by_budget": by_budget,
              "by_family": {f: {m: float(results[[i for i, (g, _) in enumerate(pairs) if g == f]][..., j, 0].mean())
                                for j, m in enumerate(METHODS)} for f in families}}
    return {"summary": summary, "detail": detail}


def _markdown(result: dict[str, Any]) -> str:
    lines = ["# PPO against its clone on held-out steps of unseen shapes", "",
             *[f"- {k}: `{v}`" if k != "figure" else f"- figure: {v}" for k, v in result["provenance"].items()], "",
             "| GPU | PPO - clone saving (pts) | 95% interval | pairs | within budget PPO / clone | drift off |",
             "| --- | ---: | --- | ---: | --- | ---: |"]
    for gpu, row in result["gpus"].items():
        lo, hi = row["ci95"]
        lines.append(f"| {gpu} | {row['delta_saved_pct']:+.3f} | [{lo:+.3f}, {hi:+.3f}] | {row['pairs']} | "
                     f"{row['within_budget_ppo']:.1%} / {row['within_budget_clone']:.1%} | "
                     f"{row['drift_off_delta_saved_pct']:+.3f} |")
    lines += ["", "Per latency (saving, share of episodes within budget):", "",
              "| GPU | latency | " + " | ".join(METHODS) + " | PPO - reference-plan (95%) | PPO / oracle |",
              "| --- | --- |" + " --- |" * len(METHODS) + " --- | --- |"]
    for gpu, detail in result["detail"].items():
        for row in detail["by_latency"]:
            cells = [f"{v['energy_saved_pct']:.2f}% / {v['within_budget']:.0%}" for v in row["methods"].values()]
            lo, hi = row["ppo_minus_reference_plan_ci95"]
            share = row["ppo_share_of_oracle"]
            lines.append(f"| {gpu} | {row['latency_scale']:g}x | " + " | ".join(cells)
                         + f" | {row['ppo_minus_reference_plan_pct']:+.2f} [{lo:+.2f}, {hi:+.2f}] | "
                         + (f"{share:.0%}" if share is not None else "-") + " |")
    lines += ["", "Per budget (PPO minus clone, saving points; share within budget):", "",
              "| GPU | budget | PPO - clone (95%) | within budget PPO / clone |", "| --- | --- | --- | --- |"]
    for gpu, detail in result["detail"].items():
        for row in detail["by_budget"]:
            lo, hi = row["ci95"]
            lines.append(f"| {gpu} | {row['budget_pct']:g}% | {row['ppo_minus_clone_pct']:+.3f} [{lo:+.3f}, {hi:+.3f}] "
                         f"| {row['within_budget_ppo']:.1%} / {row['within_budget_clone']:.1%} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", nargs="+", default=list(GPUS))
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    with ProcessPoolExecutor(args.jobs) as pool:
        runs = dict(zip(args.gpus, pool.map(run_gpu, args.gpus, [args.seeds] * len(args.gpus)), strict=True))
    command = "python -m benchmarks.learned.ppo_vs_clone" + (f" --gpus {' '.join(args.gpus)}" if args.gpus != list(GPUS)
                                                      else "") + (f" --seeds {args.seeds}" if args.seeds != 16 else "")
    result = {"provenance": provenance(command), "gpus": {g: r["summary"] for g, r in runs.items()},
              "detail": {g: r["detail"] for g, r in runs.items()}}
    write_results("ppo_vs_clone", result, _markdown(result))


if __name__ == "__main__":
    main()
