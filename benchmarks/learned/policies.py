"""Learned policies against the planners on held-out workloads under disturbances: the targets of issue 15.

    python -m benchmarks.learned.policies [--gpus h200 b200] [--episodes 8] [--jobs 2]

For each GPU with a shipped policy, every held-out step of its training config, budgets 0.5/1/2% and
switching latencies 0, the profile's and twice it: ``--episodes`` seeded episodes with every disturbance on,
scored like ``kdvfs evaluate --episodes`` (the same draws for every method): the shipped policy, the clone and
PPO's final policy, the fitting plan, the latency-aware optimum open-loop and margin-tuned, and the noise-free
optimum. Targets per case: within budget in >= 95% of episodes; saving >= the margin-tuned optimum's; >= 90% of
the noise-free optimum; per GPU the grid coverage and the decision speed. Writes
``benchmarks/results/policies.{json,md}``. Method: ``docs/design/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.provenance import provenance, write_results
from benchmarks.reports.policies import markdown
from kdvfs.agents.common.problem import Problem, score
from kdvfs.agents.learned.noisy_evaluation import COMPLIANCE, MARGIN_METHOD, closed_loop_row, noisy_rows
from kdvfs.agents.learned.policy.frozen import FrozenPolicy
from kdvfs.agents.learned.policy.policy_planner import PolicyPlanner, policy_env
from kdvfs.agents.learned.training.ppo import load_train_config
from kdvfs.agents.planners.registry import make_planner
from kdvfs.common.paths import REPO_ROOT, shipped_policy_path
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.steps.step_data import StepData
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile
from kdvfs.envs.trace.trace import Trace

GPUS = ("h200", "b200", "h100-sxm", "a100-sxm4", "rtx3080ti")
BUDGETS = (0.005, 0.01, 0.02)
LATENCY_SCALES = (0.0, 1.0, 2.0)
CANDIDATES = REPO_ROOT / "benchmarks" / "data"
"""``<kind>/<gpu>.kdvfs-policy.npz`` for kind ``imitation`` (the clone before PPO) and ``ppo`` (PPO's final
policy), copied from the training run folders; either is the shipped one."""
KINDS = ("imitation", "ppo")
OPTIMUM_SHARE = 0.9


@cache
def _shipped(gpu: str) -> tuple[GpuProfile, FrozenPolicy, dict[str, Trace]]:
    """The GPU's profile, its shipped policy and its held-out traces."""
    profile = load_profile(gpu)
    policy = FrozenPolicy.load(shipped_policy_path(gpu), profile)
    return profile, policy, dict(load_train_config(gpu).data.held_out.traces(profile))


@cache
def _loaded(gpu: str, candidates: str) -> tuple[GpuProfile, FrozenPolicy, dict[str, FrozenPolicy], dict[str, Trace]]:
    profile, policy, traces = _shipped(gpu)
    paths = {kind: Path(candidates) / kind / f"{gpu}.kdvfs-policy.npz" for kind in KINDS}
    others = {kind: FrozenPolicy.load(path, profile) for kind, path in paths.items() if path.exists()}
    return profile, policy, others, traces


def evaluate_case(gpu: str, step: str, budget: float, scale: float, episodes: int, candidates: str
                  ) -> dict[str, Any]:
    """Every method on one (GPU, held-out step, budget, latency) case, and its targets."""
    profile, policy, others, traces = _loaded(gpu, candidates)
    case = Problem.build(traces[step], profile, budget, latency_s=scale * profile.switching.latency_mean_s)
    rows = {row.method: row.as_json() for row in noisy_rows(case, PolicyPlanner(policy), [budget], episodes, 0,
                                                             ("latency-optimal",))}
    rows |= {kind: closed_loop_row(other, policy_env(other, case, disturbed=True), budget, episodes, 0, kind).as_json()
             for kind, other in others.items()}
    optimum = score(case, make_planner("latency-optimal").plan(case))
    mine, margin = rows["policy"], rows.get(MARGIN_METHOD)
    targets = {"within_budget": mine["within_budget"] >= COMPLIANCE,
               "beats_margin_optimum": margin is None or mine["energy_saved_pct"] >= margin["energy_saved_pct"],
               "share_of_optimum": mine["energy_saved_pct"] >= OPTIMUM_SHARE * optimum.energy_saved_pct}
    return {"gpu": gpu, "step": step, "budget_pct": 100 * budget, "latency_ms": 1e3 * case.latency_s,
            "rows": rows, "noise_free_optimum": optimum.as_json(), "targets": targets}


def grid_coverage(gpu: str, candidates: str) -> dict[str, Any]:
    """Pairs the static and latency-aware planners choose on the held-out steps (at each budget, the profile's
    latency) that the policy's grid lacks."""
    profile, policy, _, traces = _loaded(gpu, candidates)
    grid = policy.grid(profile)
    on_grid = {grid.label(g) for g in range(grid.size)}
    used: set[str] = set()
    for trace in traces.values():
        for budget in BUDGETS:
            problem = Problem.build(trace, profile, budget)
            used |= {problem.costs.label(int(a)) for method in ("static", "latency-optimal")
                     for a in np.unique(make_planner(method).plan(problem).actions)}
    return {"pairs_used": len(used), "missing": sorted(used - on_grid), "grid_pairs": grid.size}


def env_speed(gpu: str, rounds: int = 5, seconds: float = 2.0, **settings: Any) -> dict[str, float]:
    """Random-action decisions (and kernels) per second of one environment over the GPU's held-out steps, one
    process, its training config's environment with ``settings`` replaced: median and best of ``rounds``
    rounds."""
    profile, config = load_profile(gpu), load_train_config(gpu)
    env_config = config.env.replace(**settings)
    grid = env_config.grid(profile)
    steps = [StepData.build(name, trace, profile, grid) for name, trace in config.data.held_out.traces(profile)]
    env = KernelDVFSEnv(steps, profile, env_config)
    env.reset(seed=0)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(4096)]
    rates, kernels_per_decision = [], []
    for _ in range(rounds):
        decisions, episodes, start = 0, 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for action in actions[decisions % 3840:][:256]:
                decisions += 1
                if env.step(action)[2]:
                    episodes += 1
                    env.reset()
        rates.append(decisions / (time.perf_counter() - start))
        episode_kernels = env_config.run_steps * sum(s.kernels for s in steps) / len(steps)  # steps drawn evenly
        kernels_per_decision.append(episode_kernels * episodes / decisions)
    return {"decisions_per_s": float(np.median(rates)), "best_decisions_per_s": max(rates),
            "kernels_per_s": float(np.median(rates) * np.mean(kernels_per_decision))}


def decision_time(gpu: str) -> dict[str, float]:
    """The shipped policy's forward pass per decision (s): median and 99th percentile over real observations."""
    profile, policy, traces = _shipped(gpu)
    env = policy_env(policy, Problem.build(next(iter(traces.values())), profile, 0.01))
    observations, (observation, _), done = [], env.reset(seed=0), False
    while not done:
        observations.append(observation)
        observation, _, done, _, _ = env.step(policy.act(observation))
    times = []
    for _ in range(max(1, 20000 // len(observations))):
        for obs in observations:
            start = time.perf_counter()
            policy.act(obs)
            times.append(time.perf_counter() - start)
    return {"median_s": float(np.median(times)), "p99_s": float(np.percentile(times, 99)),
            "observation_size": int(observations[0].size)}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--gpus", nargs="+", default=list(GPUS))
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--candidates", default=str(CANDIDATES),
                        help="folder with imitation/ and ppo/ <gpu>.kdvfs-policy.npz (the clone, PPO's final policy)")
    args = parser.parse_args()
    cases = [(gpu, step, budget, scale, args.episodes, args.candidates) for gpu in args.gpus
             for step in _loaded(gpu, args.candidates)[3] for budget in BUDGETS for scale in LATENCY_SCALES]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = []
        for done, result in enumerate(pool.map(evaluate_case, *zip(*cases, strict=True)), 1):
            results.append(result)
            print(f"[{done}/{len(cases)}] {result['gpu']} {result['step']} {result['budget_pct']:g}% "
                  f"{result['latency_ms']:g} ms: {result['targets']}", flush=True)
    gpus = {}
    for gpu in args.gpus:
        policy = _loaded(gpu, args.candidates)[1]
        gpus[gpu] = {"grid": grid_coverage(gpu, args.candidates), "env_speed": env_speed(gpu),
                     "decision_time": decision_time(gpu),
                     "train_wall_s": policy.meta.get("train_wall_s"), "timesteps": policy.meta.get("timesteps"),
                     "selected": policy.meta.get("selected"),
                     "selection_comparison": policy.meta.get("selection_comparison")}
    result = {"provenance": provenance(" ".join(["python", *sys.argv])), "episodes": args.episodes,
              "cases": results, "gpus": gpus}
    write_results("policies", result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
