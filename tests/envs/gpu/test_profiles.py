"""GPU profiles: the shipped ones load and match their sources; malformed ones fail clearly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kdvfs.common.config import ConfigError
from kdvfs.common.errors import KdvfsError, ProfileError, UncalibratedError, UnknownGpuError
from kdvfs.common.paths import GPU_PROFILE_DIR, RAW_DATA_DIR
from kdvfs.envs.gpu.profiles import available_profiles, load_profile, profile_for_nvml_name


def test_all_issue_profiles_ship() -> None:
    assert {"h200", "h100-sxm", "a100-sxm4", "rtx3080ti", "b200"} <= set(available_profiles())
    for name in available_profiles():
        profile = load_profile(name)
        assert profile.name == name
        assert profile.switching.source


def test_h200_matches_the_nvml_probe_exactly() -> None:
    probe = json.loads((RAW_DATA_DIR / "h200" / "probe.json").read_text())
    profile = load_profile("h200")
    assert list(profile.clocks.memory_mhz) == probe["mem_clocks"]
    for mem, cores in probe["gfx_clocks"].items():
        assert list(profile.clocks.core_mhz[int(mem)]) == sorted(cores)
    assert profile.clocks.max_core_mhz == probe["max_clocks"]["sm"]
    assert profile.power.limit_w == probe["power_limit_mW"] / 1000
    assert list(profile.power.limit_range_w) == [c / 1000 for c in probe["power_constraints_mW"]]
    assert profile.power.idle_w == pytest.approx(probe["idle_power_mW"] / 1000, abs=0.1)
    assert profile.clock_pairs_mhz.shape == (220, 2)


def test_rtx3080ti_clocks_are_those_of_the_paper() -> None:
    profile = load_profile("rtx3080ti")
    assert profile.clocks.memory_mhz == (9501, 9251, 5001, 810, 405)
    assert profile.clocks.core_mhz[9501] == tuple(range(210, 2101, 15))
    assert profile.power.limit_w == 350


def test_b200_switches_fast_and_h200_slowly() -> None:
    assert load_profile("b200").switching.latency_mean_s < 1e-3 < load_profile("h200").switching.latency_mean_s


def test_uncalibrated_parameters_are_never_handed_out() -> None:
    with pytest.raises(UncalibratedError, match="kdvfs model fit"):
        load_profile("h200").cost_param("core_dynamic_w")


def _h200_raw() -> dict[str, Any]:
    return yaml.safe_load((GPU_PROFILE_DIR / "h200.yaml").read_text())


def _write(tmp_path: Path, raw: dict[str, Any]) -> Path:
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _set(raw: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    node = raw
    *parents, last = dotted.split(".")
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return raw


_DELETE = object()


@pytest.mark.parametrize(
    ("dotted", "value", "message"),
    [
        ("clocks.memory_mhz", [2201, 3201], "descending"),
        ("clocks.core_mhz", {3201: [1980, 345], 2201: [345, 1980]}, "ascending"),
        ("clocks.core_mhz", {3201: [345, 1980]}, "every memory clock"),
        ("clocks.max_core_mhz", 2100, "highest core clock"),
        ("clocks.core_mhz", {3201: {"min_mhz": 345, "max_mhz": 1980}, 2201: [345]}, "step_mhz"),
        ("power.limit_w", 900.0, "limit_range_w"),
        ("power.idle_w", _DELETE, "missing required key"),
        ("switching", _DELETE, "missing required key"),
        ("roofline.peak_flops", {"bf16": "989.4e12"}, "exponents with a sign"),
        ("roofline.sm_count", "many", "expected an integer"),
        ("turbo", True, "unknown key"),
        ("switching.latency_mean_s", -1.0, ">= 0"),
        ("nvml_names", _DELETE, "missing required key"),
        ("nvml_names", [], "one or more distinct NVML device names"),
        ("nvml_names", ["NVIDIA H200", "nvidia h200"], "distinct"),
        ("nvml_names", "NVIDIA H200", "expected a list"),
    ],
)
def test_malformed_profiles(tmp_path: Path, dotted: str, value: Any, message: str) -> None:
    path = _write(tmp_path, _set(_h200_raw(), dotted, value))
    with pytest.raises(ConfigError, match=message) as caught:
        load_profile(path)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize(("nvml_name", "profile"), [
    ("NVIDIA H200", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA GeForce RTX 3080 Ti", "rtx3080ti"),
    ("nvidia h200", "h200"),
])
def test_an_installed_gpu_finds_its_profile_by_nvml_name(nvml_name: str, profile: str) -> None:
    assert profile_for_nvml_name(nvml_name).name == profile


@pytest.mark.parametrize("nvml_name", ["NVIDIA H200 NVL", "NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-16GB", "H200"])
def test_an_unknown_gpu_is_one_typed_line_naming_the_fix(nvml_name: str) -> None:
    with pytest.raises(UnknownGpuError) as caught:
        profile_for_nvml_name(nvml_name)
    message = str(caught.value)
    assert repr(nvml_name) in message and "`kdvfs gpus local --write PATH`" in message and "\n" not in message
    assert isinstance(caught.value, ProfileError)


def test_every_shipped_nvml_name_belongs_to_one_profile() -> None:
    names = [name.casefold() for profile in map(load_profile, available_profiles()) for name in profile.nvml_names]
    assert len(names) == len(set(names))


def test_unknown_gpu_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError, match=r"known: .*h200"):
        load_profile("h300")


def test_invalid_yaml_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(KdvfsError, match="not valid YAML"):
        load_profile(path)
    with pytest.raises(ProfileError, match="no such GPU profile file"):
        load_profile(tmp_path / "nothing.yaml")


@pytest.mark.parametrize(
    ("dotted", "value", "message"),
    [
        ("cost_model.fixed_fraction.value", 5.0, r"cost_model\.fixed_fraction: range \[0\.0, 0\.08\] .* low <= 5 <="),
        ("cost_model.static_w.value", -3.0, r"cost_model\.static_w\.value -3 is outside \[0, inf\]"),
        ("cost_model.core_sm_w.value", float("nan"), r"cost_model\.core_sm_w\.value: expected a finite number"),
        ("cost_model.power_window_s.value", 0.0, r"power_window_s: range \[0\.001, 0\.1\] .* low <= 0 <="),
        ("roofline.sm_count", 0, "sm_count 0 must be positive"),
        ("switching.latency_mean_s", float("inf"), r"switching\.latency_mean_s: expected a finite number"),
        ("power.idle_w", 10**400, r"power\.idle_w: expected a finite number"),
    ],
)
def test_values_out_of_range_are_profile_errors_naming_field_and_file(tmp_path: Path, dotted: str, value: Any,
                                                                      message: str) -> None:
    path = _write(tmp_path, _set(_h200_raw(), dotted, value))
    with pytest.raises(ProfileError, match=message) as caught:
        load_profile(path)
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("dotted", "value", "message"),
    [
        ("cost_model.voltage_min.range", _DELETE, "needs its plausible range"),
        ("cost_model.voltage_min.range", [0.7, 0.9], r"low <= 0.65 <= high"),
        ("cost_model.voltage_min.range", [0.9, 0.5], r"low <= 0.65 <= high"),
        ("cost_model.voltage_min.range", [0.5], "expected 2 values"),
        ("cost_model.voltage_min.range_source", _DELETE, "go together"),
        ("cost_model.static_w.range_source", "a source without a range", "go together"),
        ("cost_model.voltage_min.spread", 0.1, "unknown key"),
        ("switching.latency_range_s", [0.007, 0.01], "latency_range_s"),
    ],
)
def test_parameter_ranges_load_strictly(tmp_path: Path, dotted: str, value: Any, message: str) -> None:
    path = _write(tmp_path, _set(_h200_raw(), dotted, value))
    with pytest.raises(ConfigError, match=message) as caught:
        load_profile(path)
    assert str(path) in str(caught.value)


def test_every_estimate_of_every_shipped_profile_has_a_range_with_its_source() -> None:
    for name in available_profiles():
        profile = load_profile(name)
        low, high = profile.switching.plausible_latency_s
        assert profile.switching.latency_range_s is not None and low <= profile.switching.latency_mean_s <= high
        for param in profile.cost_model.values():
            if param.status == "estimate":
                assert param.range is not None and param.range_source, (name, param)
                assert param.range[0] <= param.value <= param.range[1]


def test_switching_range_defaults_to_two_standard_deviations(tmp_path: Path) -> None:
    profile = load_profile(_write(tmp_path, _set(_h200_raw(), "switching.latency_range_s", _DELETE)))
    assert profile.switching.plausible_latency_s == pytest.approx((0.002, 0.010))


def test_transferred_from_marks_only_estimates() -> None:
    from kdvfs.envs.gpu.profiles import CostParam

    marked = CostParam(0.6, "estimate", "estimate: H200 value", (0.2, 0.9), "H200 range", "h200")
    assert marked.as_mapping()["transferred_from"] == "h200"
    assert "transferred_from" not in CostParam(1.0, "calibrated", "fit").as_mapping()
    with pytest.raises(ProfileError, match="transferred_from marks an estimate"):
        CostParam(1.0, "calibrated", "fit", transferred_from="h200")
