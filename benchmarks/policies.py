"""Learned policies against the planners on held-out workloads, and the speed figures of issue 5.

For each GPU with a shipped policy (``policies/<gpu>.kdvfs-policy.npz``) and every held-out step of its
training config, at a 1% budget: the policy, the latency-aware optimum, per-phase and the best static pair
executed with the profile's switching latency; then the ideal-switching case against the ILP. Also the
environment's decisions per second on one core, the frozen policy's decision time and the training wall
time recorded in the policy file. Writes ``benchmarks/results/policies.json`` and ``.md``:

    python benchmarks/policies.py
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from provenance import provenance, provenance_lines, write_results

from kdvfs.agents.common.problem import Problem, score
from kdvfs.agents.learned.frozen import FrozenPolicy
from kdvfs.agents.learned.imitation import Expert
from kdvfs.agents.learned.policy_planner import PolicyPlanner, policy_env, rollout, shipped_policy_path
from kdvfs.agents.learned.ppo import build_steps, load_train_config
from kdvfs.agents.planners.registry import make_planner
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile

GPUS = ("h200", "rtx3080ti")
BUDGET = 0.01
BASELINES = ("latency-optimal", "per-phase", "static")


def _saved(problem: Problem, planner: Any) -> dict[str, float]:
    result = score(problem, planner.plan(problem))
    return {"energy_saved_pct": result.energy_saved_pct, "slowdown_pct": result.slowdown_pct,
            "switches": result.switches, "solve_s": result.solve_s}


def expert(policy: FrozenPolicy, problem: Problem) -> dict[str, float]:
    """The imitation expert (follow the plan advisor for the budget) through the policy's environment."""
    env = policy_env(policy, problem)
    summary = rollout(Expert(env), env)
    return {"energy_saved_pct": summary["energy_saved_pct"], "slowdown_pct": summary["slowdown_pct"],
            "switches": summary["switches"]}


def held_out(gpu: str, policy: FrozenPolicy, profile: GpuProfile) -> list[dict[str, Any]]:
    """Every held-out step of the GPU's config: policy and planners, with latency and with ideal switching."""
    planner = PolicyPlanner(policy)
    rows = []
    for name, trace in load_train_config(gpu).data.held_out.traces(profile):
        problem = Problem.build(trace, profile, BUDGET)
        row: dict[str, Any] = {"step": name, "latency_ms": problem.latency_s * 1e3, "policy": _saved(problem, planner)}
        row.update({method: _saved(problem, make_planner(method)) for method in BASELINES})
        row["expert"] = expert(policy, problem)
        ideal = Problem.build(trace, profile, BUDGET, latency_s=0.0)
        row["ideal"] = {"policy": _saved(ideal, planner), "ilp": _saved(ideal, make_planner("ilp"))}
        oracle, mine = row["latency-optimal"]["energy_saved_pct"], row["policy"]["energy_saved_pct"]
        row["fraction_of_optimum"] = mine / oracle if oracle > 0 else float("nan")
        row["ideal"]["fraction_of_ilp"] = row["ideal"]["policy"]["energy_saved_pct"] / \
            row["ideal"]["ilp"]["energy_saved_pct"]
        rows.append(row)
        print(f"{gpu} {name}: policy {mine:.2f}% vs optimum {oracle:.2f}%", flush=True)
    return rows


def env_speed(gpu: str, rounds: int = 8, seconds: float = 2.0, **settings: Any) -> dict[str, float]:
    """Random-action decisions per second of one environment over the GPU's held-out steps, one process:
    median and best of ``rounds`` rounds (the machine's speed varies between rounds). ``settings`` replace
    the training config's environment settings."""
    profile = load_profile(gpu)
    env_config = load_train_config(gpu).env.replace(**settings)
    steps = build_steps(load_train_config(gpu).data.held_out.traces(profile), profile, env_config.grid(profile))
    env = KernelDVFSEnv(steps, profile, env_config)
    env.reset(seed=0)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(4096)]
    decision_rates, kernel_rates = [], []
    for _ in range(rounds):
        decisions = kernels = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            for action in actions[decisions % 3840:][:256]:
                before = env.clocks[0]
                _, _, done, _, _ = env.step(action)
                decisions, kernels = decisions + 1, kernels + env.clocks[0] - before
                if done:
                    env.reset()
        elapsed = time.perf_counter() - start
        decision_rates.append(decisions / elapsed)
        kernel_rates.append(kernels / elapsed)
    return {"decisions_per_s": float(np.median(decision_rates)), "best_decisions_per_s": max(decision_rates),
            "kernels_per_s": float(np.median(kernel_rates))}


def decision_time(policy: FrozenPolicy, profile: GpuProfile) -> dict[str, float]:
    """Frozen-policy forward pass per decision (s): median and 99th percentile over real observations."""
    config = load_train_config(profile.name)
    _, trace = config.data.held_out.traces(profile)[0]
    env = policy_env(policy, Problem.build(trace, profile, BUDGET))
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
            "best_s": float(np.min(times)), "samples": len(times),
            "observation_size": int(observations[0].size)}


def _markdown(result: dict[str, Any]) -> str:
    lines = ["# Learned policies on held-out workloads", ""]
    lines += provenance_lines(result["provenance"])
    for gpu, figures in result["gpus"].items():
        lines += ["", f"## {gpu}: 1% budget, {figures['held_out'][0]['latency_ms']:g} ms switching", "",
                  "| held-out step | policy saved | slowdown | latency-optimal | fraction | per-phase | static | "
                  "switches | expert (plan for the budget) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for row in figures["held_out"]:
            p, o = row["policy"], row["latency-optimal"]
            lines.append(f"| {row['step']} | {p['energy_saved_pct']:.2f}% | {p['slowdown_pct']:.2f}% | "
                         f"{o['energy_saved_pct']:.2f}% / {o['slowdown_pct']:.2f}% | "
                         f"{row['fraction_of_optimum']:.0%} | "
                         f"{row['per-phase']['energy_saved_pct']:.2f}% / {row['per-phase']['slowdown_pct']:.2f}% | "
                         f"{row['static']['energy_saved_pct']:.2f}% / {row['static']['slowdown_pct']:.2f}% | "
                         f"{p['switches']} | {row['expert']['energy_saved_pct']:.2f}% / "
                         f"{row['expert']['slowdown_pct']:.2f}% |")
        lines += ["", "Ideal switching (no latency, no stall), 1% budget:", "",
                  "| held-out step | policy saved / slowdown | ILP saved / slowdown | fraction |",
                  "| --- | ---: | ---: | ---: |"]
        for row in figures["held_out"]:
            p, i = row["ideal"]["policy"], row["ideal"]["ilp"]
            lines.append(f"| {row['step']} | {p['energy_saved_pct']:.2f}% / {p['slowdown_pct']:.2f}% | "
                         f"{i['energy_saved_pct']:.2f}% / {i['slowdown_pct']:.2f}% | "
                         f"{row['ideal']['fraction_of_ilp']:.0%} |")
        speed, decision = figures["env_speed"], figures["decision_time"]
        lines += ["", f"- environment, one process, random actions: median {speed['decisions_per_s']:,.0f} "
                  f"decisions/s (best round {speed['best_decisions_per_s']:,.0f}; {speed['kernels_per_s']:,.0f} "
                  "kernels/s)",
                  f"- frozen policy, one decision ({decision['observation_size']} inputs): median "
                  f"{decision['median_s'] * 1e6:.1f} us, p99 {decision['p99_s'] * 1e6:.1f} us, best "
                  f"{decision['best_s'] * 1e6:.1f} us",
                  f"- training wall time: {figures['train_wall_s'] / 60:.1f} min for {figures['timesteps']:,} "
                  "timesteps (recorded in the policy file)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    gpus = {}
    for gpu in GPUS:
        profile = load_profile(gpu)
        policy = FrozenPolicy.load(shipped_policy_path(gpu), profile)
        gpus[gpu] = {"held_out": held_out(gpu, policy, profile), "env_speed": env_speed(gpu),
                     "decision_time": decision_time(policy, profile),
                     "train_wall_s": policy.meta.get("train_wall_s", float("nan")),
                     "timesteps": policy.meta.get("timesteps", 0)}
    result = {"provenance": provenance("python benchmarks/policies.py"), "budget": BUDGET, "gpus": gpus}
    write_results("policies", result, _markdown(result))
    print(_markdown(result))


if __name__ == "__main__":
    main()
