"""``kdvfs train`` and ``kdvfs evaluate``: learn a clock policy for a GPU with PPO, and score a frozen
policy next to every planner on a step."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kdvfs.agents.learned.policy.shipped import policy_source_path
from kdvfs.common.errors import KdvfsError
from kdvfs.runtime.cli.arguments import add_output, add_power_limit, budget_list, check_output_folder, latency_ms
from kdvfs.runtime.cli.offline.plan import latency_from_args, problem_from_args, ranges_of, row_json
from kdvfs.runtime.cli.render import (
    add_range_arguments,
    basis_lines,
    compare_table,
    console,
    noisy_table,
    print_json,
)

if TYPE_CHECKING:
    from kdvfs.agents.common.problem import Problem
    from kdvfs.agents.learned.policy.policy_planner import PolicyPlanner
    from kdvfs.envs.gpu.profiles import GpuProfile


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser("train", help="train a clock policy for a GPU with PPO")
    train.add_argument("--gpu", required=True, help="GPU profile name the policy is for")
    train.add_argument("--config", type=Path, help="PPO config YAML, whole or with `extends: <gpu>` and "
                       "what differs, or a bundled config's name (default: configs/ppo/<gpu>.yaml; "
                       "residual-<gpu>: the experimental residual design, which `kdvfs run` runs online too)")
    train.add_argument("--timesteps", type=int, help="environment steps to train for (default: the config's)")
    train.add_argument("--seed", type=int, nargs="+", help="seed of PPO and the environments (default: the "
                       "config's; the run's resolved config records the one used); several: one run each, in "
                       "OUT/seed-S, the steps priced once for all")
    add_output(train, "run folder: logs, checkpoints, frozen policy", dest="out", required=True)
    train.add_argument("--force", action="store_true", help="train into a run folder that already holds files "
                       "(files of the same name are replaced)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(func=run_train)

    evaluate = subparsers.add_parser("evaluate", help="a frozen policy next to every planner on a step")
    evaluate.add_argument("--policy", required=True, help="frozen policy file (.kdvfs-policy.npz) or shipped policy "
                          "name (`kdvfs policy list`, e.g. h200)")
    evaluate.add_argument("--trace", required=True, nargs="+", help="trace file or bundled name; with --reference, "
                          "the executed steps (one or more, each with meta.step_shape)")
    evaluate.add_argument("--reference", nargs="+", help="captured steps of the run's model at several shapes: "
                          "score the policy and the predicted steps' plans on each executed --trace "
                          "(auto, reference-plan, policy, prediction-optimum, oracle)")
    evaluate.add_argument("--gpu", required=True, help="GPU profile name or .yaml")
    evaluate.add_argument("--latency-ms", type=latency_ms, help="switching latency to execute with, at most 10 s "
                          "(default: the profile's; 0 = ideal switching)")
    evaluate.add_argument("--budget", "--slowdown", dest="budget", type=budget_list, default=[0.01],
                          help="budgets (default 0.01 = 1%%)")
    add_power_limit(evaluate)
    evaluate.add_argument("--episodes", type=_positive_int, help="N seeded episodes with the environment's "
                          "disturbances, every planner open-loop on the same draws (default: one, no disturbance)")
    evaluate.add_argument("--seed", type=int, default=0, help="seed of the first episode and of the sampled "
                          "profiles (default 0)")
    add_range_arguments(evaluate, seed=False)
    evaluate.add_argument("--json", action="store_true", help="print JSON for scripts (as `kdvfs compare --json`)")
    evaluate.set_defaults(func=run_evaluate)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive integer")
    return value


def _stage_printer() -> Callable[[str], None]:
    """Print each training stage with the seconds since training started."""
    start = time.perf_counter()
    return lambda text: console.print(f"[{time.perf_counter() - start:6.0f} s] {text}", highlight=False)


def run_train(args: argparse.Namespace) -> int:
    seeds = args.seed or [None]
    if len(set(seeds)) != len(seeds):
        raise KdvfsError(f"--seed {' '.join(map(str, seeds))} names a seed twice")
    outs = [args.out] if len(seeds) == 1 else [args.out / f"seed-{seed}" for seed in seeds]
    for out in outs:
        check_output_folder(out)
        held = sorted(path.name for path in out.iterdir()) if out.is_dir() else []
        if held and not args.force:
            shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
            raise KdvfsError(f"{out} holds files of another run ({shown}); give a new folder, or --force to train "
                             "into it (files of the same name are replaced)")
    stage = _stage_printer()
    stage("loading PyTorch and stable-baselines3")
    from tqdm import TqdmExperimentalWarning

    from kdvfs.agents.learned.training.ppo import load_train_config
    from kdvfs.agents.learned.training.train import TrainingData, train

    warnings.filterwarnings("ignore", category=TqdmExperimentalWarning)  # SB3's rich progress bar works
    config = load_train_config(args.config or args.gpu)
    if config.gpu != args.gpu:
        raise KdvfsError(f"--gpu {args.gpu} but the config {args.config} trains for {config.gpu!r}; pass a matching "
                         "--config")
    if args.timesteps is not None and args.timesteps <= 0:
        raise KdvfsError(f"--timesteps {args.timesteps} must be > 0")
    data = TrainingData.price(config, not args.no_progress, stage) if len(seeds) > 1 else None
    for seed, out in zip(seeds, outs, strict=True):
        seeded = config if seed is None else dataclasses.replace(config, seed=seed)
        if len(seeds) > 1:
            stage(f"seed {seed} into {out}")
        result = train(seeded, out, args.timesteps, progress_bar=not args.no_progress, stage=stage, data=data)
        console.print(f"trained {result.timesteps} timesteps in {result.wall_s / 60:.1f} min; ships "
                      f"{result.selected} (validation: {json.dumps(result.comparison)})")
        console.print(f"wrote {result.policy_path} (TensorBoard: {out / 'tensorboard'})")
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    from kdvfs.agents.evaluation.compare import EVALUATED, compare
    from kdvfs.agents.learned.policy.policy_planner import PolicyPlanner, policy_rows

    if args.reference:
        return _evaluate_shapes(args)
    if len(args.trace) != 1:
        raise KdvfsError(f"--trace takes one step without --reference, not {len(args.trace)}")
    args.trace = args.trace[0]
    problem = problem_from_args(args, args.budget[0], power_limit_w=args.power_limit_w)
    planner = PolicyPlanner.from_file(policy_source_path(args.policy), problem.profile)
    if args.episodes is not None:
        return _evaluate_noisy(args, problem, planner)
    with console.status("planning") as status:
        rows = compare(problem, args.budget, EVALUATED, lambda text: status.update(f"planning: {text}"))
        status.update("policy")
        rows = sorted(rows + policy_rows(problem, planner, args.budget), key=lambda row: row.budget)
    ranges = ranges_of(problem, rows, args)
    if args.json:
        print_json([row_json(row, spread) for row, spread in zip(rows, ranges, strict=True)])
    else:
        console.print(compare_table(rows, problem, ranges))
        for line in basis_lines(*next((r.basis, r.samples) for r in ranges if r is not None)):
            console.print(line)
    return 0


def _evaluate_noisy(args: argparse.Namespace, problem: Problem, planner: PolicyPlanner) -> int:
    from kdvfs.agents.learned.noisy_evaluation import noisy_rows

    with console.status("episodes") as status:
        rows = noisy_rows(problem, planner, args.budget, args.episodes, args.seed,
                          progress=lambda text: status.update(f"evaluating: {text}"))
    if args.json:
        print_json([row.as_json() for row in rows])
    else:
        console.print(noisy_table(rows, problem))
    return 0


def _evaluate_shapes(args: argparse.Namespace) -> int:
    """``evaluate --reference``: every method on each executed step (:mod:`kdvfs.agents.learned.shape_evaluation`)."""
    from kdvfs.agents.learned.policy.frozen import FrozenPolicy
    from kdvfs.agents.learned.shape_evaluation import evaluate_shapes
    from kdvfs.envs.gpu.profiles import load_profile
    from kdvfs.envs.trace.bundled import open_trace

    if len(args.budget) != 1:
        raise KdvfsError(f"--reference takes one --slowdown, not {len(args.budget)}")
    if args.power_limit_w is not None:
        raise KdvfsError("--reference prices every step at the limit it was recorded under; drop --power-limit-w")
    profile = load_profile(args.gpu)
    policy = FrozenPolicy.load(policy_source_path(args.policy), profile)
    references = [open_trace(name) for name in args.reference]
    executed = [(name, open_trace(name)) for name in args.trace]
    with console.status("evaluating the executed steps"):
        result = evaluate_shapes(policy, references, executed, profile, args.budget[0], latency_from_args(args),
                                 args.episodes, args.seed)
    if args.json:
        print_json(result)
    else:
        margin = result["prediction_margin"]
        console.print(_scored(args, profile) + f"; plans of predicted steps at {margin['margin']:.0%} of the "  # type: ignore[index]
                      "budget (the prediction margin)\n", highlight=False)
        for method, row in result["summary"].items():  # type: ignore[attr-defined]
            console.print(f"{method:15s} energy saved {row['energy_saved_pct']:6.2f}%  slowdown "
                          f"{row['slowdown_pct']:6.2f}%  within budget on {row['within_budget']:.0%} of steps")
    return 0


def _scored(args: argparse.Namespace, profile: GpuProfile) -> str:
    """``evaluate --reference``'s header: what it scored, on which GPU, at which budget and switching latency."""
    latency_s = latency_from_args(args)
    latency = (f"{profile.switching.latency_mean_s * 1e3:g} ms (the profile's)" if latency_s is None else
               f"{latency_s * 1e3:g} ms (--latency-ms)")
    episodes = "" if args.episodes is None else f", {args.episodes} disturbed episodes from seed {args.seed}"
    steps, references = len(args.trace), len(args.reference)
    return (f"policy {args.policy} on {steps} executed step{'s' * (steps > 1)} ({', '.join(args.trace)}), "
            f"predicted from {references} reference{'s' * (references > 1)} ({', '.join(args.reference)}); "
            f"GPU {profile.name}, budget {args.budget[0]:.1%}, switching latency {latency}{episodes}")
