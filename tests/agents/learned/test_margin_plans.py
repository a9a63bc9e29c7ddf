"""The bar's scoring (:mod:`kdvfs.agents.learned.training.margin_plans`): how many seeds a validation case gets."""

from __future__ import annotations

from dataclasses import replace

from kdvfs.agents.learned.training.margin_plans import MIN_SCORE_SEEDS, score_seeds
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.steps.shape_pairs import ShapeSet
from kdvfs.envs.gpu.profiles import load_profile


def test_validation_scores_every_executed_variant_and_at_least_two_seeds() -> None:
    """A seed picks the executed variant ``seed % V``: one seed per variant scores each of them once (validation
    once scored the first two of four); steps that execute as predicted still get two seeds."""
    profile = load_profile("h200")
    grid = EnvConfig(plan_budgets=(0.0, 0.01)).grid(profile)
    shapes = ShapeSet(("gpt2s",), layers=2, batch_scales=(1.0,), seqs=(256, 512, 1024), references=2, variants=4)
    pairs = shapes.pairs(profile, grid)
    assert {len(pair.executed) for pair in pairs} == {4} and score_seeds(pairs) == 4
    assert score_seeds([replace(pairs[0], executed=pairs[0].executed[:3]), pairs[1]]) == 4
    assert score_seeds([replace(pair, executed=()) for pair in pairs]) == MIN_SCORE_SEEDS == 2
