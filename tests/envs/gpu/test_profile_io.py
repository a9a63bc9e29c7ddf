"""Writing GPU profiles: a profile written by ``write_profile_yaml`` loads back with every field."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdvfs.common.config import load_yaml, to_plain
from kdvfs.common.errors import ProfileError
from kdvfs.common.paths import GPU_PROFILE_DIR
from kdvfs.envs.gpu.profile_io import write_profile_yaml
from kdvfs.envs.gpu.profiles import available_profiles, load_profile


@pytest.mark.parametrize("name", available_profiles())
def test_round_trip_keeps_every_field(name: str, tmp_path: Path) -> None:
    shipped = load_profile(name)
    written = write_profile_yaml(to_plain(shipped), tmp_path / f"{name}.yaml")
    assert written == shipped == load_profile(tmp_path / f"{name}.yaml")


def test_round_trip_keeps_the_nvml_names(tmp_path: Path) -> None:
    names = ["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"]
    raw = {**load_yaml(GPU_PROFILE_DIR / "a100-sxm4.yaml"), "nvml_names": names}
    written = write_profile_yaml(raw, tmp_path / "a100.yaml")
    assert written.nvml_names == tuple(names)
    assert load_yaml(tmp_path / "a100.yaml")["nvml_names"] == list(written.nvml_names)


def test_a_profile_without_nvml_names_is_not_written(tmp_path: Path) -> None:
    raw = {key: value for key, value in load_yaml(GPU_PROFILE_DIR / "h200.yaml").items() if key != "nvml_names"}
    with pytest.raises(ProfileError, match="nvml_names: missing required key"):
        write_profile_yaml(raw, tmp_path / "h200.yaml")
    assert not (tmp_path / "h200.yaml").exists()
