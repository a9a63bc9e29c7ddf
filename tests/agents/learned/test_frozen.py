"""Frozen policies: export/load round trip against SB3, mismatch errors, and the planner interface."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from kdvfs.agents.common.problem import Problem, score
from kdvfs.agents.learned.policy.frozen import FrozenPolicy, PolicyFileError
from kdvfs.agents.learned.policy.policy_planner import PolicyPlanner, policy_env, rollout
from kdvfs.agents.learned.training.ppo import load_train_config
from kdvfs.agents.learned.training.train import PPO_FILE, TrainResult
from kdvfs.common.paths import REPO_ROOT, shipped_policy_path
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.bundled import open_trace
from tests.agents.learned.near_ties import logit_pair

SHIPPED = ("h200", "b200", "h100-sxm", "a100-sxm4", "rtx3080ti")


def _sb3_logits(model: PPO, normalized: np.ndarray) -> list[np.ndarray]:
    """SB3's logits (log-probabilities) of each action part for one normalised observation."""
    tensor, _ = model.policy.obs_to_tensor(normalized)
    with torch.no_grad():
        parts = model.policy.get_distribution(tensor).distribution
    return [part.logits[0].numpy() for part in parts]


def _assert_same_choice(model: PPO, normalize: VecNormalize, policy: FrozenPolicy, observation: np.ndarray) -> None:
    """The frozen policy picks SB3's deterministic action, or (float32 vs torch rounding) one whose SB3 logit
    ties the best to 1e-4."""
    ours = policy.act(observation)
    normalized = normalize.normalize_obs(observation)
    expected, _ = model.predict(normalized, deterministic=True)
    for part, logits in enumerate(_sb3_logits(model, normalized)):
        assert logits[ours[part]] >= logits[expected[part]] - 1e-4, (part, ours, expected)


def test_numpy_forward_equals_sb3_deterministic_action(tiny_run: TrainResult) -> None:
    profile = load_profile("h200")
    policy = FrozenPolicy.load(tiny_run.out / PPO_FILE, profile)  # model.zip is PPO's final model
    model = PPO.load(tiny_run.out / "model.zip", device="cpu")
    env = policy_env(policy, Problem.build(open_trace("h200/gpt2s-b16"), profile, 0.01))
    normalize = VecNormalize.load(str(tiny_run.out / "vecnormalize.pkl"), DummyVecEnv([lambda: env]))
    observation, _ = env.reset(seed=0)
    env.action_space.seed(0)
    rng = np.random.default_rng(0)
    for _ in range(300):
        _assert_same_choice(model, normalize, policy, observation)
        noisy = observation + rng.normal(0, 1, observation.shape).astype(np.float32)
        _assert_same_choice(model, normalize, policy, noisy)
        observation, _, done, _, _ = env.step(env.action_space.sample())
        if done:
            observation, _ = env.reset()


def test_save_load_round_trip(tiny_run: TrainResult, tmp_path: Path) -> None:
    profile = load_profile("h200")
    policy = FrozenPolicy.load(tiny_run.policy_path, profile)
    policy.save(tmp_path / "copy.kdvfs-policy.npz")
    again = FrozenPolicy.load(tmp_path / "copy.kdvfs-policy.npz", profile)
    observation = np.random.default_rng(1).normal(0, 3, policy.obs_mean.shape).astype(np.float32)
    assert np.array_equal(policy.act(observation), again.act(observation))
    assert again.gpu == "h200" and again.spec_hash == policy.spec_hash


def test_another_gpu_is_a_clear_error(tiny_run: TrainResult) -> None:
    with pytest.raises(PolicyFileError, match="trained for GPU 'h200', not 'rtx3080ti'"):
        FrozenPolicy.load(tiny_run.policy_path, load_profile("rtx3080ti"))


def test_another_observation_spec_is_a_clear_error(tiny_run: TrainResult, tmp_path: Path) -> None:
    profile = load_profile("h200")
    policy = FrozenPolicy.load(tiny_run.policy_path, profile)
    path = tmp_path / "old.kdvfs-policy.npz"
    replace(policy, spec_hash="0" * 16).save(path)
    with pytest.raises(PolicyFileError, match="observation spec"):
        FrozenPolicy.load(path, profile)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "missing"])
def test_damaged_files_are_clear_errors(tiny_run: TrainResult, tmp_path: Path, damage: str) -> None:
    path = tmp_path / "bad.kdvfs-policy.npz"
    if damage == "garbage":
        path.write_bytes(b"not a policy")
    elif damage == "truncated":
        path.write_bytes(tiny_run.policy_path.read_bytes()[:300])
    with pytest.raises(PolicyFileError, match=r"bad\.kdvfs-policy\.npz"):
        FrozenPolicy.load(path, load_profile("h200"))


def test_policy_planner_schedule_scores_as_its_rollout(tiny_run: TrainResult) -> None:
    profile = load_profile("h200")
    problem = Problem.build(open_trace("h200/gpt2s-b16"), profile, 0.01)
    planner = PolicyPlanner.from_file(tiny_run.policy_path, profile)
    schedule = planner.plan(problem)
    assert schedule.reactive and schedule.actions.shape == (problem.costs.kernels,)
    summary = rollout(planner.policy, policy_env(planner.policy, problem))
    result = score(problem, schedule)
    assert result.energy_saved_pct == pytest.approx(summary["energy_saved_pct"], abs=1e-9)
    assert result.slowdown_pct == pytest.approx(summary["slowdown_pct"], abs=1e-9)


@pytest.mark.parametrize("gpu", SHIPPED)
def test_shipped_policies_load_for_their_gpu(gpu: str) -> None:
    policy = FrozenPolicy.load(shipped_policy_path(gpu), load_profile(gpu))
    assert policy.gpu == gpu and policy.env["plan_actions"] is True  # a removed setting, at its only value


def test_a_policy_of_the_removed_action_design_is_refused_in_one_line() -> None:
    policy = FrozenPolicy.load(shipped_policy_path("h200"), load_profile("h200"))
    with pytest.raises(PolicyFileError, match=r"plan_actions=False.*retrain"):
        replace(policy, env={**policy.env, "plan_actions": False})


def _published_case(gpu: str, step: str, budget_pct: float, latency_ms: float) -> dict[str, Any]:
    result = json.loads((REPO_ROOT / "benchmarks/results/policies.json").read_text())
    return next(c for c in result["cases"] if (c["gpu"], c["step"], c["budget_pct"]) == (gpu, step, budget_pct)
                and c["latency_ms"] == pytest.approx(latency_ms)) | {"episodes": result["episodes"]}


@pytest.mark.parametrize(("gpu", "step", "scale"), [("h200", "h200/gpt2s-b16", 1.0), ("b200", "gpt2s", 1.0),
                                                     ("rtx3080ti", "bert-base", 0.0)])
def test_shipped_policies_reproduce_their_published_held_out_results(gpu: str, step: str, scale: float) -> None:
    profile = load_profile(gpu)
    latency_s = scale * profile.switching.latency_mean_s
    published = _published_case(gpu, step, 1.0, 1e3 * latency_s)
    trace = dict(load_train_config(gpu).data.held_out.traces(profile))[step]
    problem = Problem.build(trace, profile, 0.01, latency_s=latency_s)
    policy = FrozenPolicy.load(shipped_policy_path(gpu), profile)
    env = policy_env(policy, problem, disturbed=True)
    summaries = [rollout(policy, env, {"step": 0, "budget": 0.01}, seed) for seed in range(published["episodes"])]
    expected = published["rows"]["policy"]
    assert np.mean([s["energy_saved_pct"] for s in summaries]) == pytest.approx(expected["energy_saved_pct"], rel=1e-9)
    assert np.mean([s["slowdown_pct"] for s in summaries]) == pytest.approx(expected["slowdown_pct"], rel=1e-9)


@pytest.mark.parametrize("gpu", SHIPPED)
def test_the_split_first_layer_gives_the_whole_observations_action(gpu: str) -> None:
    """``act_from`` (the static part's first-layer share computed ahead) against ``act``: the same action on
    observations spread like the policy's training observations, or one whose logit ties to 1e-4 (float32
    sums in another order)."""
    profile = load_profile(gpu)
    policy = FrozenPolicy.load(shipped_policy_path(gpu), profile)
    rng = np.random.default_rng(0)
    size = policy.spec(profile).static_size
    observations = [rng.normal(policy.obs_mean, np.sqrt(policy.obs_var) + 1e-3).astype(np.float32)
                    for _ in range(200)]
    firsts = policy.first_products(np.stack(observations)[:, :size], 0, size)
    for row, observation in enumerate(observations):
        whole, split = policy.act(observation), policy.act_from(firsts, np.array([row]), observation[size:])
        assert whole[0] == split[0] or np.isclose(*logit_pair(policy, observation, whole, split, 0), atol=1e-4)
        assert whole[1] == split[1] or np.isclose(*logit_pair(policy, observation, whole, split, 1), atol=1e-4)
