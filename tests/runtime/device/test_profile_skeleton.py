"""GPU profile skeletons from NVML facts: schema, provenance, clock compression and safe writing."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path
from typing import Any

import pytest

from kdvfs.common.config import load_yaml
from kdvfs.common.errors import ProfileError
from kdvfs.common.paths import GPU_PROFILE_DIR, RAW_DATA_DIR
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.runtime.device.nvml_device import LocalGpu
from kdvfs.runtime.device.profile_skeleton import (
    compress_clocks_mhz,
    reference_profile,
    skeleton_profile,
    write_skeleton_yaml,
)

PROBE = json.loads((RAW_DATA_DIR / "h200" / "probe.json").read_text())


def probe_gpu(**changes: Any) -> LocalGpu:
    """The idle H200 of data/raw/h200/probe.json as NVML facts, with ``changes`` applied."""
    gpu = LocalGpu(
        index=0, name=PROBE["name"], uuid="GPU-0", driver_version=PROBE["driver"],
        memory_clocks_mhz=tuple(PROBE["mem_clocks"]),
        core_clocks_mhz=types.MappingProxyType({int(m): tuple(c) for m, c in PROBE["gfx_clocks"].items()}),
        max_core_mhz=PROBE["max_clocks"]["sm"], default_memory_mhz=PROBE["default_app_clocks"]["mem"],
        power_limit_w=PROBE["power_limit_mW"] / 1000, power_limit_range_w=(200.0, 700.0),
        power_draw_w=PROBE["idle_power_mW"] / 1000, utilization_pct=0, sm_count=None,
        memory_total_bytes=143_771 * 2**20,
    )
    return dataclasses.replace(gpu, **changes)


def test_h200_skeleton_matches_shipped_profile(tmp_path: Path) -> None:
    mapping = skeleton_profile(probe_gpu(), "lab-h200")
    shipped_raw = load_yaml(GPU_PROFILE_DIR / "h200.yaml")
    assert list(mapping) == list(shipped_raw)
    assert mapping["clocks"] == shipped_raw["clocks"]
    assert mapping["power"]["limit_w"] == shipped_raw["power"]["limit_w"]
    assert mapping["power"]["limit_range_w"] == shipped_raw["power"]["limit_range_w"]
    assert mapping["power"]["idle_w"] == pytest.approx(76.701)
    assert (mapping["architecture"], mapping["roofline"]) == (shipped_raw["architecture"], shipped_raw["roofline"])
    profile = write_skeleton_yaml(mapping, tmp_path / "lab-h200.yaml")
    assert profile == load_profile(tmp_path / "lab-h200.yaml")
    assert profile.clocks == load_profile("h200").clocks


def test_sources_say_what_is_measured_and_copied() -> None:
    mapping = skeleton_profile(probe_gpu(), "lab-h200")
    measured, copied = mapping["sources"]
    assert "NVML" in measured and "idle power" in measured and "580.159.04" in measured
    assert "copied from the shipped profile h200" in copied
    assert all(fact in copied for fact in ("architecture", "peak FLOP/s", "SM count", "switching latency"))
    assert mapping["switching"]["estimated"] is True
    assert mapping["switching"]["source"].startswith("copied from the shipped profile h200")


def test_busy_gpu_takes_idle_power_from_reference() -> None:
    mapping = skeleton_profile(probe_gpu(utilization_pct=85, power_draw_w=640.0), "busy")
    assert mapping["power"]["idle_w"] == load_profile("h200").power.idle_w
    assert "idle power" in mapping["sources"][1] and "idle power" not in mapping["sources"][0]


def test_unknown_utilisation_counts_as_busy() -> None:
    mapping = skeleton_profile(probe_gpu(utilization_pct=None), "unknown")
    assert mapping["power"]["idle_w"] == load_profile("h200").power.idle_w


def test_sm_count_from_nvml_wins() -> None:
    mapping = skeleton_profile(probe_gpu(sm_count=114), "h200-sm")
    assert mapping["roofline"]["sm_count"] == 114 and "SM count" in mapping["sources"][0]


@pytest.mark.parametrize(("model", "reference"), [
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4"),
    ("NVIDIA GeForce RTX 3080 Ti", "rtx3080ti"),
    ("NVIDIA B200", "b200"),
    ("Tesla V100-SXM2-16GB", "h200"),
])
def test_reference_profile(model: str, reference: str) -> None:
    assert reference_profile(model).name == reference


def test_skeleton_lists_the_gpus_nvml_name(tmp_path: Path) -> None:
    mapping = skeleton_profile(probe_gpu(name="NVIDIA H200 NVL"), "nvl")
    assert mapping["nvml_names"] == ["NVIDIA H200 NVL"]
    assert write_skeleton_yaml(mapping, tmp_path / "nvl.yaml").applies_to("nvidia h200 nvl")


def test_reference_supplies_architecture() -> None:
    mapping = skeleton_profile(probe_gpu(name="NVIDIA B200"), "b200-lab")
    assert mapping["architecture"] == "blackwell"
    assert mapping["switching"]["latency_mean_s"] == load_profile("b200").switching.latency_mean_s


@pytest.mark.parametrize(("clocks", "expected"), [
    ([345, 360, 375, 390], {"min_mhz": 345, "max_mhz": 390, "step_mhz": 15}),
    ([345, 360, 380], [345, 360, 380]),
    ([345, 360], [345, 360]),
    ([1980], [1980]),
])
def test_compress_clocks(clocks: list[int], expected: object) -> None:
    assert compress_clocks_mhz(clocks) == expected


def test_irregular_clocks_stay_a_list(tmp_path: Path) -> None:
    cores = (*PROBE["gfx_clocks"]["2201"][:-1], 1995)
    gpu = probe_gpu(core_clocks_mhz={3201: tuple(PROBE["gfx_clocks"]["3201"]), 2201: cores})
    mapping = skeleton_profile(gpu, "odd")
    assert mapping["clocks"]["core_mhz"][2201] == list(cores)
    assert write_skeleton_yaml(mapping, tmp_path / "odd.yaml").clocks.core_mhz[2201] == cores


def test_max_clock_disagreement_is_noted() -> None:
    mapping = skeleton_profile(probe_gpu(max_core_mhz=1995), "odd")
    assert mapping["clocks"]["max_core_mhz"] == 1980
    assert "1995 MHz differs" in mapping["sources"][-1]


def test_invalid_profile_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("old content\n")
    mapping = skeleton_profile(probe_gpu(power_draw_w=800.0), "bad")
    with pytest.raises(ProfileError, match=r"not writing .*bad\.yaml.*idle_w"):
        write_skeleton_yaml(mapping, path)
    assert path.read_text() == "old content\n" and sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_profile_path_must_be_yaml(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"\.yaml"):
        write_skeleton_yaml(skeleton_profile(probe_gpu(), "x"), tmp_path / "x.txt")
    assert not list(tmp_path.iterdir())


def test_written_profile_leaves_no_temp_files(tmp_path: Path) -> None:
    write_skeleton_yaml(skeleton_profile(probe_gpu(), "lab"), tmp_path / "profiles" / "lab.yaml")
    assert [p.name for p in (tmp_path / "profiles").iterdir()] == ["lab.yaml"]
    assert (tmp_path / "profiles" / "lab.yaml").read_text().startswith("# GPU profile skeleton")
