"""Episodes from pairs: predicted steps of unseen shapes, executed variants, and the environment drawing them."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from kdvfs.common.config import ConfigError
from kdvfs.common.errors import KdvfsError
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.steps.clock_grid import ClockGrid
from kdvfs.envs.env.steps.shape_pairs import Perturbation, ShapePair, ShapeSet, expert_work
from kdvfs.envs.env.steps.step_data import StepData, priced
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.schedule import ActionCosts
from kdvfs.envs.synthetic.generator import generate_transformer_trace, load_workload
from kdvfs.envs.trace.trace import Trace
from tests.envs.env.env_doubles import PREVIOUS

PROFILE = load_profile("h200")
CONFIG = PREVIOUS.replace(plan_budgets=(0.0, 0.01))
GRID = CONFIG.grid(PROFILE)
SHAPES = ShapeSet(("gpt2s",), layers=2, batch_scales=(0.5, 1.0), seqs=(256, 512, 1024), references=3, variants=3)


@pytest.fixture(scope="module")
def pairs() -> list[ShapePair]:
    return SHAPES.pairs(PROFILE, GRID)


def test_a_family_is_its_shapes_by_tokens_each_with_its_step_shape() -> None:
    traces = SHAPES.family("gpt2s", PROFILE)
    tokens = [t.meta.step_shape.tokens for t in traces if t.meta.step_shape is not None]
    assert len(tokens) == 6 and tokens == sorted(tokens)
    assert SHAPES.reference_indices(6) == [0, 2, 5] and ShapeSet(("gpt2s",), 2, (1.0,), (256, 512, 1024),
                                                                  references=0).reference_indices(3) is None


def test_every_shape_gets_a_pair_whose_first_variant_is_the_real_step(pairs: list[ShapePair]) -> None:
    traces = SHAPES.family("gpt2s", PROFILE)
    assert len(pairs) == len(traces)
    for pair, trace in zip(pairs, traces, strict=True):
        real = StepData.build(trace.meta.workload, trace, PROFILE, GRID)
        assert len(pair.executed) == 3 and all(v.kernels == pair.predicted.kernels for v in pair.executed)
        # executed_as moves the real step onto the prediction's kernels, keeping every pair's totals
        assert np.allclose(pair.executed[0].cumulative[-1], real.cumulative[-1])
    references = [pairs[i] for i in SHAPES.reference_indices(len(pairs)) or []]
    for pair in references:  # a captured shape's prediction is the captured step itself
        assert np.allclose(pair.predicted.cumulative[-1], pair.executed[0].cumulative[-1])


def test_a_perturbation_keeps_the_first_kernel_and_the_experts_total() -> None:
    moe = generate_transformer_trace(load_workload("mixtral-moe"), PROFILE)
    rng = np.random.default_rng(0)
    quiet = Perturbation(category_sigma=0.0, gap_sigma=0.0, duration_sigma=0.0, dropped=0.0, inserted=0.0)
    out = quiet.apply(moe, rng)
    experts = [k.duration_s for k in moe.kernels if expert_work(k.name)]
    drawn = [k.duration_s for k in out.kernels if expert_work(k.name)]
    assert len(experts) > 100 and len(out.kernels) == len(moe.kernels) and np.isclose(sum(drawn), sum(experts))
    assert not np.allclose(drawn, experts)  # each expert's share of the tokens is redrawn
    churn = Perturbation(dropped=0.3, inserted=0.3).apply(moe, rng)
    assert churn.kernels[0].name == moe.kernels[0].name and len(churn.kernels) != len(moe.kernels)


def test_the_env_executes_a_drawn_variant_while_observing_the_prediction(pairs: list[ShapePair]) -> None:
    env = KernelDVFSEnv([p.predicted for p in pairs], PROFILE, CONFIG, executed=[p.executed for p in pairs],
                        duration_noise=0.0, latency_noise=False)
    check_env(env, skip_render_check=True)
    ran = set()
    for seed in range(12):
        env.reset(seed=seed, options={"step": 1})
        done, time_s = False, 0.0
        while not done:
            _, _, done, _, info = env.step(np.array([0, 0]))  # auto throughout: the time is the executed step's
            time_s += info["time_s"]
        ran |= {v for v, view in enumerate(pairs[1].executed) if np.isclose(time_s, view.auto_time_s)}
    assert ran == {0, 1, 2}  # every variant is drawn, and the time run is one of theirs
    with pytest.raises(KdvfsError, match="one per step"):
        KernelDVFSEnv([p.predicted for p in pairs], PROFILE, CONFIG, executed=[pairs[0].executed])


def test_bad_shape_sets_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="references"):
        ShapeSet(("gpt2s",), 2, (1.0,), (256, 512), references=2)


def test_an_executed_view_with_kernels_that_did_not_run_observes_finite_numbers() -> None:
    trace = SHAPES.family("gpt2s", PROFILE)[0]
    churned = Perturbation(dropped=0.3).apply(trace, np.random.default_rng(1))
    view = StepData.executed_as(*_priced_pair(trace, churned))
    assert (view.time_s[:, 0] == 0).any()  # expected kernels that did not run cost nothing
    env = KernelDVFSEnv([view], PROFILE, CONFIG, latency_s=0.0)  # ideal switching: windows of single kernels
    assert np.isfinite(env.static_rows).all() and np.isfinite(env.reset(seed=0)[0]).all()


def _priced_pair(expected: Trace, executed: Trace) -> tuple[Trace, Trace, ActionCosts, ClockGrid]:
    expected_trace, _ = priced(expected, PROFILE)
    executed_trace, costs = priced(executed, PROFILE)
    return expected_trace, executed_trace, costs, GRID
