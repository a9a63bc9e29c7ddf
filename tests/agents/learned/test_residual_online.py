"""A residual policy deciding online (:mod:`kdvfs.agents.learned.policy.residual_online`): the environment's
observation of the same measured state, its decision points, and the release."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.policy.deciders import online_decider
from kdvfs.agents.learned.policy.frozen import FrozenPolicy, PolicyFileError
from kdvfs.agents.learned.policy.live_decision import NO_REQUEST
from kdvfs.agents.learned.policy.online import OnlinePolicy
from kdvfs.agents.learned.policy.policy_planner import policy_env
from kdvfs.agents.learned.policy.residual_decision import host_times
from kdvfs.agents.learned.policy.residual_online import ResidualOnlinePolicy
from kdvfs.envs.env.observing.live import LiveState
from kdvfs.envs.env.observing.measured import FEATURES, RELEASE, MeasuredState
from kdvfs.envs.env.residual_env import ResidualDVFSEnv
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.bundled import open_trace

RESIDUAL_POLICY = Path(__file__).parent / "fixtures" / "h200-residual.kdvfs-policy.npz"
"""A residual H200 policy (``benchmarks/data/learned/h200-s0``, constrained PPO), copied for the tests."""


@pytest.fixture(scope="module")
def residual() -> tuple[FrozenPolicy, Problem]:
    profile = load_profile("h200")
    return FrozenPolicy.load(RESIDUAL_POLICY, profile), Problem.build(open_trace("h200/gpt2s-b16"), profile, 0.01)


def live_state(state: MeasuredState) -> LiveState:
    """``state`` as the controller measures it (:class:`LiveState`: host times over the measured auto scale)."""
    scale = 1.0 + state.drift_pct / 100.0
    return LiveState(state.kernel, state.in_effect, state.pending, state.pending_age_s / scale,
                     state.elapsed_s / scale, state.auto_elapsed_s, state.last_latency_ratio, state.drift_pct,
                     state.model_elapsed_s)


def test_the_runtime_runs_each_design_in_its_own_decider(residual: tuple[FrozenPolicy, Problem]) -> None:
    policy, problem = residual
    assert isinstance(online_decider(policy, problem), ResidualOnlinePolicy)
    with pytest.raises(PolicyFileError, match="ResidualOnlinePolicy") as raised:
        OnlinePolicy(policy, problem)
    assert "\n" not in str(raised.value)


def test_the_controllers_state_is_the_environments_measured_state() -> None:
    state = MeasuredState(17, 3, 5, 2e-3, 0.0417, 0.0401, 0.0399, 1.7, 1.3)
    live = live_state(state)
    pending_age_s, elapsed_s = host_times(live.pending_age_s, live.elapsed_s, live.auto_drift_pct)
    measured = MeasuredState(live.kernel, live.in_effect, live.pending, pending_age_s, elapsed_s,
                             live.model_elapsed_s, live.auto_elapsed_s, live.auto_drift_pct, live.last_latency_ratio)
    assert measured == pytest.approx(state, rel=1e-12)


def test_env_and_runtime_observe_and_decide_the_same_on_a_recorded_step(
        residual: tuple[FrozenPolicy, Problem]) -> None:
    """One observation for environment and runtime: episodes of a residual policy on a bundled trace (every
    disturbance on), each of the env's decision points fed to the online decider as the controller feeds it (a
    ``LiveState`` of the env's measured state): the decider decides exactly there (a budget event, or the
    standing order naming another pair with nothing pending), on the env's observation (bit for bit), with the
    env's action; its first pair is the one kernel 0 ran at."""
    policy, problem = residual
    env = policy_env(policy, problem, disturbed=True, one_step=True)
    assert isinstance(env, ResidualDVFSEnv)
    decider = ResidualOnlinePolicy(policy, problem)
    decider.prepare()
    checked = 0
    for seed in range(6):
        observation, _ = env.reset(seed=seed, options={"budget": problem.budget})
        decider.follow_drift(env.measured_state().drift_pct)
        first = decider.begin(problem.budget)
        done, start = False, True
        while not done:
            assert np.array_equal(decider.acted_on, observation), (seed, checked)
            action = policy.act(observation)
            observation, _, done, _, _ = env.step(action)
            if start:  # the clocks kernel 0 ran at (a cost index), the first pair's
                assert env.applied[0] == env.steps[0].actions[first]
                start = False
            if not done:
                state = env.measured_state()
                decision = decider.decide(live_state(state), state.elapsed_s)
                assert decision.evaluated and decision.next_change is None, (seed, state)
                assert decision.action == tuple(policy.act(decider.acted_on).tolist())
            checked += 1
    assert checked > 30


def releasing_past(policy: FrozenPolicy, progress: float) -> FrozenPolicy:
    """``policy`` rewired to follow the fitting plan (the zero action) and to release the clocks at any decision
    whose progress entry exceeds ``progress``: one hidden path carries tanh(tanh(entry - ``progress``)) (no
    normalisation) to the release's logit, which beats the zero margin's small bias once it is positive."""
    weights = [np.zeros_like(w) for w in policy.weights]
    biases = [np.zeros_like(b) for b in policy.biases]
    weights[0][FEATURES.index("progress"), 0], biases[0][0] = 1.0, -progress
    weights[1][0, 0] = 1.0
    core, memory, _ = policy.nvec
    weights[2][0, core + memory + RELEASE] = 10.0
    biases[2][[0, core, core + memory]] = (1.0, 1.0, 1e-3)
    return replace(policy, weights=tuple(weights), biases=tuple(biases), obs_mean=np.zeros_like(policy.obs_mean),
                   obs_var=np.ones_like(policy.obs_var))


def test_the_release_names_auto_once_then_nothing_for_the_rest_of_the_step(
        residual: tuple[FrozenPolicy, Problem]) -> None:
    """A policy that follows the plan, then releases at its next decision: the decider names auto (the controller
    requests it once the clocks are free: once), never runs the policy again in the step, wakes for nothing,
    and its look-ahead finds nothing; the next step decides afresh."""
    policy, problem = residual
    decider = ResidualOnlinePolicy(releasing_past(policy, 0.0), problem)
    decider.prepare()
    first = decider.begin(0.01)
    started_on = decider.acted_on.copy()
    assert first != 0 and decider.policy.act(started_on).tolist() == [0, 0, 0]  # the plan's first pair, locked
    kernels = len(decider.cumulative_s) - 1
    event_s = decider.auto_time_s / decider.env.config.budget_events
    at = int(np.searchsorted(decider.cumulative_s[:, 0], event_s))  # past the first budget event: a decision
    auto_s = float(decider.cumulative_s[at, 0])
    released = decider.decide(LiveState(at, first, NO_REQUEST, 0.0, auto_s, auto_s, 1.0, 0.0, auto_s), auto_s)
    assert released.evaluated and released.pair == 0 and released.action[2] == RELEASE
    assert released.next_change == kernels and released.policy_due_s == np.inf
    released_on = decider.acted_on.copy()
    for kernel, in_effect, pending in ((at + 1, first, 7), (at + 2, first, NO_REQUEST), (at + 5, 0, NO_REQUEST),
                                       (kernels - 1, 0, NO_REQUEST)):
        auto_s = float(decider.cumulative_s[kernel, 0])
        later = decider.decide(LiveState(kernel, in_effect, pending, 0.0, auto_s, auto_s, 1.0, 0.0, auto_s), auto_s)
        assert (later.pair, later.evaluated, later.next_change) == (0, False, kernels)
        times_s = np.full(3, auto_s)
        assert decider.first_change(np.full(3, kernel), in_effect, times_s, times_s, 1.0, 0.0, times_s) == 3
    assert np.array_equal(decider.acted_on, released_on)  # the policy ran on nothing since
    assert decider.begin(0.01) == first and np.array_equal(decider.acted_on, started_on)  # a new step decides afresh


def test_a_frozen_policy_copy_is_what_buckets_run(residual: tuple[FrozenPolicy, Problem]) -> None:
    policy, problem = residual
    assert isinstance(online_decider(replace(policy), problem), ResidualOnlinePolicy)


def test_prepare_runs_every_compiled_call_of_a_step(residual: tuple[FrozenPolicy, Problem],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``prepare`` calls each compiled function a step calls: none is compiled (or loaded from numba's cache) on
    the controller's thread in a controlled step."""
    import kdvfs.agents.learned.policy.residual_online as residual_online

    policy, problem = residual
    called: set[str] = set()
    for name in ("begin_bound", "decide_residual", "warm_residual", "first_change_residual"):
        function = getattr(residual_online, name)
        monkeypatch.setattr(residual_online, name,
                            lambda *args, _name=name, _function=function: called.add(_name) or _function(*args))
    prepared = ResidualOnlinePolicy(policy, problem)
    prepared.prepare()
    assert called == {"begin_bound", "decide_residual", "warm_residual", "first_change_residual"}
