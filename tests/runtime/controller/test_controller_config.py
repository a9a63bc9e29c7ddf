"""The controller's config: flat options go to their groups, and the child's JSON round-trips the groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdvfs.runtime.controller import ControllerConfig
from kdvfs.runtime.controller.config import FLAT_OPTIONS, MeasurementConfig, OnlineConfig, TimingConfig


def test_flat_options_go_to_their_groups() -> None:
    config = ControllerConfig.from_options("p", "t", budget=0.02, window_s=0.1, anchor_every=3, online=False,
                                           online_interval_ms=0.5, online_warm_up=False, sleep_lead_in=False)
    assert config.budget == 0.02 and config.measurement == MeasurementConfig(window_s=0.1)
    assert config.timing == TimingConfig(anchor_every=3)
    assert config.online == OnlineConfig(enabled=False, interval_ms=0.5, warm_up=False, sleep_lead_in=False)
    assert ControllerConfig.from_options("p", "t") == ControllerConfig(policy="p", trace="t")


def test_every_flat_option_names_a_field_of_its_group() -> None:
    config = ControllerConfig(policy="p", trace="t")
    assert all(hasattr(getattr(config, group), name) for group, name in FLAT_OPTIONS.values())


def test_an_unknown_option_is_refused() -> None:
    with pytest.raises(TypeError, match="online_lookahead"):
        ControllerConfig.from_options("p", "t", online_lookahead=2)


def test_the_child_config_round_trips(tmp_path: Path) -> None:
    config = ControllerConfig.from_options("p", "t", dry_run=True, ab_share=0.5, anchors=False, online=False,
                                           gpu_index=1, log="run.jsonl")
    config.save(tmp_path / "run.json")
    assert ControllerConfig.load(tmp_path / "run.json") == config
