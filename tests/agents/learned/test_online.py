"""``OnlinePolicy``: the shipped policy deciding on live states, as its environment would."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.policy.frozen import FrozenPolicy
from kdvfs.agents.learned.policy.live_decision import NO_REQUEST
from kdvfs.agents.learned.policy.online import OnlinePolicy, kernel_at
from kdvfs.agents.learned.policy.policy_planner import PolicyPlanner, policy_env
from kdvfs.common.paths import shipped_policy_path
from kdvfs.envs.env.advice import landings
from kdvfs.envs.env.advice.plan_advice import PlanAdvice
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.observing.live import LiveState
from kdvfs.envs.env.observing.live_tables import DEPENDS_ON_BUDGET, NO_PLAN, LiveTables, next_change_in, plan_of
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.bundled import open_trace
from tests.agents.learned.near_ties import logit_pair
from tests.envs.env.env_doubles import observe_state


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


def test_a_decision_a_rounding_short_of_its_due_time_runs(online: tuple[OnlinePolicy, Problem]) -> None:
    """A controller that slept until the due time reads a clock a hair short of it (host <-> model time
    rounding): the policy runs then, not at a later point."""
    policy, _ = online
    policy.begin(0.01)
    state = LiveState(5, 0, -1, 0.0, float(policy.cumulative_s[5, 0]), float(policy.cumulative_s[5, 0]))
    hold_s = policy.policy.config.decision_fraction * policy.auto_time_s
    due_s = policy.decide(state, 0.0).policy_due_s
    assert due_s == hold_s
    start_s, scale = 12_345.678, 1.0137  # a host clock's start and the step's auto scale
    woken_s = ((start_s + scale * due_s) - start_s) / scale  # host time of the due time, and back
    assert policy.decide(state, min(woken_s, np.nextafter(due_s, 0.0))).evaluated
    assert not policy.decide(state, due_s + 0.5 * hold_s).evaluated


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
    kernels, static = len(policy.cumulative_s) - 2, lazy.observation_spec.static_size
    states = [LiveState((29 * pair) % kernels, pair, -1, 0.0, float(policy.cumulative_s[(29 * pair) % kernels, 0]),
                        float(policy.cumulative_s[(29 * pair) % kernels, 0])) for pair in range(len(policy.labels))]
    expected = [observe_state(lazy, state)[static:] for state in states]

    def first_use(*args: object) -> None:
        raise AssertionError("computed on the decision path")

    monkeypatch.setattr(landings, "landing_kernels", first_use)
    monkeypatch.setattr(PlanAdvice, "proposal_changes", first_use)
    for state, observation in zip(states, expected, strict=True):
        policy.decide(state, 1e9)
        assert np.array_equal(policy.env.live_tables().obs[static:], observation)


def _next_change(env: KernelDVFSEnv, tables: LiveTables, action: np.ndarray, kernel: int, in_effect: int
                 ) -> int | None:
    """Where the pair an order names can next change with ``in_effect`` in effect, from the tables' proposal
    changes (None: it depends on the budget; K: never)."""
    plan, kernels = plan_of(action[0], action[1], env.budget_plan, tables.sizes), env.steps[0].kernels
    if plan in (DEPENDS_ON_BUDGET, NO_PLAN):
        return None if plan == DEPENDS_ON_BUDGET else kernels
    at = in_effect * len(env.observation_spec.plan_budgets) + plan
    return int(next_change_in(tables.change_kernels[tables.change_offsets[at]:tables.change_offsets[at + 1]],
                              kernel, kernels))


def test_a_plans_proposal_holds_until_the_next_change_the_tables_name(online: tuple[OnlinePolicy, Problem]) -> None:
    """Brute force: the pair a plan order names, observed at every kernel with the clocks in effect unchanged,
    differs from the one before exactly at the kernels the proposal changes name."""
    policy, _ = online
    policy.begin(0.01)
    env, plans = policy.env, len(policy.policy.config.plan_budgets)
    tables, kernels = env.live_tables(), env.steps[0].kernels
    seen = 0
    for in_effect in (0, 5):
        for choice in (*range(plans), plans + 1):  # each plan, then the budget's plan
            action = np.array([1, choice])

            def proposal(kernel: int, action: np.ndarray = action, in_effect: int = in_effect) -> int:
                auto_s = float(policy.cumulative_s[kernel, 0])
                observe_state(env, LiveState(kernel, in_effect, -1, 0.0, auto_s, auto_s))
                return env.target_pair(action)

            pairs = [proposal(k) for k in range(kernels)]
            changes = [k for k in range(1, kernels) if pairs[k] != pairs[k - 1]]
            named, at = [], 0
            while (change := _next_change(env, tables, action, at, in_effect)) is not None and change < kernels:
                named.append(change)
                at = change
            assert named == changes
            seen += len(changes)
    assert seen > 0
    assert _next_change(env, tables, np.array([1, plans]), 0, 0) is None  # the fitting plan: depends on the budget
    assert _next_change(env, tables, np.array([0, 0]), 0, 0) == kernels  # no request


def test_the_env_and_the_online_decision_observe_the_same_on_a_recorded_step(
        online: tuple[OnlinePolicy, Problem]) -> None:
    """One observation for environment and runtime: episodes of the shipped H200 policy on a bundled trace
    (every disturbance on, deciding at every decision point), each decision point's state
    (``KernelDVFSEnv.live_state``) fed to the online decision as a controller feeds the states it measures; its
    observation (static rows and the dynamic part it writes) is the env's bit for bit, its action the policy's
    on it, its pair the env's target."""
    policy, problem = online
    disturbed = policy_env(policy.policy, problem, disturbed=True, one_step=True)
    simulated = KernelDVFSEnv(disturbed.steps, problem.profile, disturbed.config.replace(decision_fraction=0.0))
    static, checked, pending = simulated.observation_spec.static_size, 0, 0  # the policy decides at every point
    for seed in range(3):
        observation, _ = simulated.reset(seed=seed, options={"budget": problem.budget})
        policy.begin(problem.budget)
        now_s, done = 1e9, False  # every decision runs the policy
        while not done:
            state = simulated.live_state()
            decision = policy.decide(state, now_s)
            online_observation = np.concatenate([policy.env.static_rows[state.kernel],
                                                 policy.env.live_tables().obs[static:]])
            assert np.array_equal(online_observation, observation), (seed, state)
            action, whole = np.array(decision.action), policy.policy.act(observation)
            assert decision.evaluated and all(action[part] == whole[part] or np.isclose(
                *logit_pair(policy.policy, observation, action, whole, part), atol=1e-4) for part in range(len(action)))
            assert decision.pair == (simulated.target_pair(action) if action[0] else NO_REQUEST)
            observation, _, done, _, _ = simulated.step(action)
            now_s, checked, pending = now_s + 1e9, checked + 1, pending + (state.pending >= 0)
    assert checked > 40 and pending > 0


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
    change and its budget figures are the env's own at that state (its observation, its tables)."""
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
        observation = observe_state(policy.env, state)
        assert decision.pair == (policy.env.target_pair(action) if action[0] else NO_REQUEST)
        assert decision.next_change == _next_change(policy.env, policy.env.live_tables(), action, kernel,
                                                    state.in_effect)
        assert (decision.budget_used, decision.affordable_pct) == tuple(observation[budget + 1:budget + 3].tolist())
        whole = policy.policy.act(observation)
        for part in range(len(action)):
            assert action[part] == whole[part] or np.isclose(
                *logit_pair(policy.policy, observation, action, whole, part), atol=1e-4), (n, part)


PREPARED_IN_A_FRESH_PROCESS = """
from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.policy import forward, live_decision
from kdvfs.agents.learned.policy.frozen import FrozenPolicy
from kdvfs.agents.learned.policy.online import OnlinePolicy
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
