"""``kdvfs train`` and ``kdvfs evaluate``: learn a clock policy for a GPU with PPO, and score a frozen
policy next to every planner on a step."""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kdvfs.agents.learned.shipped import policy_source_path
from kdvfs.envs.common.errors import KdvfsError
from kdvfs.runtime.cli.arguments import add_output, budget_list, check_output_folder
from kdvfs.runtime.cli.offline.plan import add_problem_arguments, problem_from_args
from kdvfs.runtime.cli.render import compare_table, console, noisy_table, print_json

if TYPE_CHECKING:
    from kdvfs.agents.common.problem import Problem
    from kdvfs.agents.learned.policy_planner import PolicyPlanner


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser("train", help="train a clock policy for a GPU with PPO")
    train.add_argument("--gpu", required=True, help="GPU profile name the policy is for")
    train.add_argument("--config", type=Path, help="PPO config YAML, whole or with `extends: <gpu>` and "
                       "what differs (default: configs/ppo/<gpu>.yaml)")
    train.add_argument("--timesteps", type=int, help="environment steps to train for (default: the config's)")
    add_output(train, "run folder: logs, checkpoints, frozen policy", dest="out", required=True)
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(func=run_train)

    evaluate = subparsers.add_parser("evaluate", help="a frozen policy next to every planner on a step")
    evaluate.add_argument("--policy", required=True, help="frozen policy file (.kdvfs-policy.npz) or shipped policy "
                          "name (`kdvfs policy list`, e.g. h200)")
    add_problem_arguments(evaluate)
    evaluate.add_argument("--budget", "--slowdown", dest="budget", type=budget_list, default=[0.01],
                          help="budgets (default 0.01 = 1%%)")
    evaluate.add_argument("--episodes", type=_positive_int, help="N seeded episodes with the environment's "
                          "disturbances, every planner open-loop on the same draws (default: one, no disturbance)")
    evaluate.add_argument("--seed", type=int, default=0, help="seed of the first episode (default 0)")
    evaluate.add_argument("--json", action="store_true", help="print JSON for scripts (as `kdvfs compare --json`)")
    evaluate.set_defaults(func=run_evaluate)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive integer")
    return value


def _stage_printer() -> Callable[[str], None]:
    """Print each training stage with the seconds since training started."""
    start = time.perf_counter()
    return lambda text: console.print(f"[{time.perf_counter() - start:6.0f} s] {text}", highlight=False)


def run_train(args: argparse.Namespace) -> int:
    check_output_folder(args.out)
    stage = _stage_printer()
    stage("loading PyTorch and stable-baselines3")
    from tqdm import TqdmExperimentalWarning

    from kdvfs.agents.learned.ppo import load_train_config
    from kdvfs.agents.learned.train import train

    warnings.filterwarnings("ignore", category=TqdmExperimentalWarning)  # SB3's rich progress bar works
    config = load_train_config(args.config or args.gpu)
    if config.gpu != args.gpu:
        raise KdvfsError(f"--gpu {args.gpu} but the config {args.config} trains for {config.gpu!r}; pass a matching "
                         "--config")
    if args.timesteps is not None and args.timesteps <= 0:
        raise KdvfsError(f"--timesteps {args.timesteps} must be > 0")
    result = train(config, args.out, args.timesteps, progress_bar=not args.no_progress, stage=stage)
    console.print(f"trained {result.timesteps} timesteps in {result.wall_s / 60:.1f} min; held-out steps "
                  f"(deterministic, {config.env.budgets[0]:.1%} budget):")
    for name, outcome in result.held_out.items():
        console.print(f"  {name}: energy saved {outcome['energy_saved_pct']:.2f}%, slowdown "
                      f"{outcome['slowdown_pct']:.2f}%, {outcome['switches']} switches")
    console.print(f"wrote {result.policy_path} (TensorBoard: {args.out / 'tensorboard'})")
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    from kdvfs.agents.evaluation.compare import compare
    from kdvfs.agents.learned.policy_planner import PolicyPlanner, policy_rows
    from kdvfs.agents.planners.registry import COMPARED

    problem = problem_from_args(args, args.budget[0])
    planner = PolicyPlanner.from_file(policy_source_path(args.policy), problem.profile)
    if args.episodes is not None:
        return _evaluate_noisy(args, problem, planner)
    with console.status("planning") as status:
        rows = compare(problem, args.budget, COMPARED, lambda text: status.update(f"planning: {text}"))
        status.update("policy")
        rows = sorted(rows + policy_rows(problem, planner, args.budget), key=lambda row: row.budget)
    if args.json:
        print_json([row.as_json() for row in rows])
    else:
        console.print(compare_table(rows, problem))
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
