"""``OnlinePolicy``: the shipped policy deciding on live states, as its environment would."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.frozen import FrozenPolicy
from kdvfs.agents.learned.live_decision import NO_REQUEST
from kdvfs.agents.learned.online import OnlinePolicy, kernel_at
from kdvfs.agents.learned.policy_planner import PolicyPlanner, policy_env
from kdvfs.common.paths import shipped_policy_path
from kdvfs.envs.env import landings
from kdvfs.envs.env.live import LiveState
from kdvfs.envs.env.plan_advice import PlanAdvice
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.bundled import open_trace
from tests.agents.learned.near_ties import logit_pair


@pytest.fixture(scope="module")
def online() -> tuple[OnlinePolicy, Problem]:
    profile = load_profile("h200")
    problem = Problem.build(open_trace("h200/gpt3xl-1layer-b4"), profile, 0.01)
    return OnlinePolicy(FrozenPolicy.load(shipped_policy_path("h200"), profile), problem), problem


def test_the_first_pair_is_the_noise_free_rollouts(online: tuple[OnlinePolicy, Problem]) -> None:
    policy, problem = online
    schedule = PolicyPlanner(policy.policy).plan(problem)
    first = policy.begin(problem.budget)
    assert policy.labels[first] == problem.costs.label(int(schedule.actions[0]))


def test_the_policy_runs_when_its_choice_has_held_long_enough(online: tuple[OnlinePolicy, Problem]) -> None:
    policy, _ = online
    policy.begin(0.01)
    state = LiveState(5, 0, -1, 0.0, float(policy.cumulative_s[5, 0]), float(policy.cumulative_s[5, 0]))
    hold_s = policy.policy.config.decision_fraction * policy.auto_time_s
    assert not policy.decide(state, 0.5 * hold_s).evaluated  # the standing order of the step's first decision
    decision = policy.decide(state, 1.01 * hold_s)
    assert decision.evaluated and (decision.pair == NO_REQUEST or 0 <= decision.pair < len(policy.labels))
    assert not policy.decide(state, 1.5 * hold_s).evaluated


def test_a_step_running_late_shows_as_budget_used(online: tuple[OnlinePolicy, Problem]) -> None:
    policy, _ = online
    policy.begin(0.01)
    kernel = len(policy.cumulative_s) // 2
    auto_s = float(policy.cumulative_s[kernel, 0])
    on_time = policy.decide(LiveState(kernel, 0, -1, 0.0, auto_s, auto_s), 0.0)
    late = policy.decide(LiveState(kernel, 0, -1, 0.0, auto_s + 0.01 * policy.auto_time_s, auto_s), 0.0)
    assert on_time.budget_used == 0.0 and np.isclose(late.budget_used, 1.0, atol=1e-4)
    assert late.affordable_pct < on_time.affordable_pct


def test_kernel_at_inverts_the_timeline(online: tuple[OnlinePolicy, Problem]) -> None:
    policy, _ = online
    times_s = policy.cumulative_s[:, 0].tolist()
    assert kernel_at(times_s, 10, 0.0) == 10
    assert kernel_at(times_s, 10, times_s[20] - times_s[10] + 1e-9) == 20
    assert kernel_at(times_s, 10, 1e3) == len(times_s) - 2  # never past the last kernel
    assert policy.pair_of(policy.labels[3]) == 3


def test_on_the_rollouts_env_it_decides_as_on_an_env_of_its_own(online: tuple[OnlinePolicy, Problem]) -> None:
    """The controller builds the policy's env once, for the replayed schedule's rollout and the online policy."""
    fresh, problem = online
    env = policy_env(fresh.policy, problem)
    PolicyPlanner(fresh.policy).plan(problem, env)
    shared = OnlinePolicy(fresh.policy, problem, env)
    assert shared.begin(0.01) == fresh.begin(0.01)
    for n in range(200):
        kernel = (37 * n) % (len(fresh.cumulative_s) - 2)
        auto_s = float(fresh.cumulative_s[kernel, 0])
        state = LiveState(kernel, n % 3, -1, 0.0, auto_s * (1 + 0.002 * (n % 5)), auto_s)
        assert shared.decide(state, 1e-3 * n) == fresh.decide(state, 1e-3 * n)


def test_once_prepared_its_decisions_do_no_first_use_work_as_a_lazy_env(online: tuple[OnlinePolicy, Problem],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where requests land and the plans' proposal changes are computed for every pair by ``prepare``, with the
    values a fresh env computes on first use."""
    policy, problem = online
    policy.prepare()
    lazy = policy_env(policy.policy, problem)
    lazy.reset(seed=0, options={"budget": 0.01})
    policy.begin(0.01)
    plans = [np.array([1, lazy.advisor_action("plans", i)]) for i in range(len(policy.policy.config.plan_budgets))]
    kernels = len(policy.cumulative_s) - 2
    states = [LiveState((29 * pair) % kernels, pair, -1, 0.0, float(policy.cumulative_s[(29 * pair) % kernels, 0]),
                        float(policy.cumulative_s[(29 * pair) % kernels, 0])) for pair in range(len(policy.labels))]
    expected = [(lazy.observe_live_dynamic(state).copy(), [lazy.next_proposal_change(a) for a in plans])
                for state in states]

    def first_use(*args: object) -> None:
        raise AssertionError("computed on the decision path")

    monkeypatch.setattr(landings, "landing_kernels", first_use)
    monkeypatch.setattr(PlanAdvice, "proposal_changes", first_use)
    for state, (observation, changes) in zip(states, expected, strict=True):
        assert np.array_equal(policy.env.observe_live_dynamic(state), observation)
        assert [policy.env.next_proposal_change(a) for a in plans] == changes
        policy.decide(state, 1e9)


def test_a_warm_up_leaves_no_trace_on_the_decisions(online: tuple[OnlinePolicy, Problem]) -> None:
    policy, problem = online
    plain, warmed = OnlinePolicy(policy.policy, problem, policy.env), OnlinePolicy(policy.policy, problem)
    rng = np.random.default_rng(3)
    hold_s = policy.policy.config.decision_fraction * policy.auto_time_s
    assert plain.begin(0.01) == warmed.begin(0.01)
    for now_s in np.sort(rng.uniform(0, policy.auto_time_s, 30)):
        kernel = kernel_at(plain.cumulative_s[:, 0].tolist(), 0, float(now_s))
        auto_s = float(plain.cumulative_s[kernel, 0])
        state = LiveState(kernel, int(rng.integers(3)), -1, 0.0, float(now_s) * 1.01, auto_s)
        other = LiveState(int(rng.integers(kernel + 1)), int(rng.integers(3)), 1, 1e-4, auto_s * 1.05, auto_s)
        warmed.warm(other)  # at a state of its own: the next decision stands at its own
        assert warmed.decide(state, float(now_s) + hold_s) == plain.decide(state, float(now_s) + hold_s)


def test_its_action_is_the_policys_on_the_whole_live_observation(online: tuple[OnlinePolicy, Problem]) -> None:
    """The decision adds the first layer's rows computed ahead for the static part and the clock blocks (of the
    pairs in effect and pending, any of them) to the rest's product: the action is the policy's on the whole
    observation, or a logit near-tie (float32 sums in another order); the pair it names, its next proposal
    change and its budget figures are the env's own at that state (its methods, its lazily computed tables)."""
    policy, _ = online
    budget = policy.env.observation_spec.span("budget").start
    rng, pairs, kernels = np.random.default_rng(5), len(policy.labels), len(policy.cumulative_s) - 2
    policy.begin(0.01)
    for n in range(300):
        kernel = int(rng.integers(kernels))
        auto_s = float(policy.cumulative_s[kernel, 0])
        pending = int(rng.integers(-1, pairs))
        state = LiveState(kernel, int(rng.integers(pairs)), pending, 1e-3 if pending >= 0 else 0.0,
                          auto_s * float(rng.uniform(0.98, 1.04)), auto_s)
        decision = policy.decide(state, 1e3 * (n + 1))
        action = np.array(decision.action)
        observation = policy.env.observe_live(state)
        assert decision.pair == (policy.env.target_pair(action) if action[0] else NO_REQUEST)
        assert decision.next_change == policy.env.next_proposal_change(action)
        assert (decision.budget_used, decision.affordable_pct) == tuple(observation[budget + 1:budget + 3].tolist())
        whole = policy.policy.act(observation)
        for part in range(len(action)):
            assert action[part] == whole[part] or np.isclose(
                *logit_pair(policy.policy, observation, action, whole, part), atol=1e-4), (n, part)


PREPARED_IN_A_FRESH_PROCESS = """
from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned import forward, live_decision
from kdvfs.agents.learned.frozen import FrozenPolicy
from kdvfs.agents.learned.online import OnlinePolicy
from kdvfs.common.paths import shipped_policy_path
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.bundled import open_trace
profile = load_profile("h200")
online = OnlinePolicy(FrozenPolicy.load(shipped_policy_path("h200"), profile),
                      Problem.build(open_trace("h200/gpt3xl-1layer-b4"), profile, 0.01))
before = (len(live_decision.decide_bound.signatures), len(forward.act.signatures))
online.prepare()
print(before, (len(live_decision.decide_bound.signatures), len(forward.act.signatures)))
"""


def test_prepare_compiles_the_decision_before_any_step() -> None:
    """In a fresh process nothing is compiled until ``prepare``, which compiles (or loads) the first pair's
    policy and the decision, so that neither happens in the first controlled step."""
    done = subprocess.run([sys.executable, "-c", PREPARED_IN_A_FRESH_PROCESS], capture_output=True, text=True,
                          check=True, timeout=300)
    assert done.stdout.split("\n")[-2] == "(0, 0) (1, 1)"


def test_reading_ahead_finds_the_first_state_at_which_a_re_read_would_request(
        online: tuple[OnlinePolicy, Problem]) -> None:
    """``first_change`` over a run of states ahead returns the first at which re-reading the standing order
    (a decision that does not run the policy) would name a pair other than the one in effect: the states a
    controller would have polled at, read in one call."""
    policy, _ = online
    found = []
    for in_effect in (0, 3, 10):
        for slow in (1.0, 1.02, 1.06):
            policy.begin(0.01)
            kernels = np.arange(2, len(policy.cumulative_s) - 1, 3, dtype=np.int64)
            auto_s = policy.cumulative_s[kernels, 0]
            model_s = policy.cumulative_s[kernels, in_effect]
            elapsed_s = slow * model_s
            states = [LiveState(int(k), in_effect, NO_REQUEST, 0.0, float(e), float(a), 1.0, 0.0, float(m))
                      for k, e, a, m in zip(kernels, elapsed_s, auto_s, model_s, strict=True)]
            polled = next((j for j, state in enumerate(states)
                           if policy.decide(state, 0.0).pair not in (NO_REQUEST, in_effect)), len(states))
            assert policy.first_change(kernels, in_effect, elapsed_s, auto_s, 1.0, 0.0, model_s) == polled
            found.append(polled < len(states))
    assert any(found)
