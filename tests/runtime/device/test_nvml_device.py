"""Reading GPUs through NVML (read-only), error translation and ``kdvfs gpus local``.

NVML is replaced by the recording :class:`~kdvfs.runtime.testing.fake_nvml.FakeNvml` of the H200 recorded in
data/raw/h200/probe.json.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import re
from pathlib import Path

import pynvml
import pytest

from kdvfs.common.config import load_yaml
from kdvfs.common.errors import KdvfsError
from kdvfs.common.paths import GPU_PROFILE_DIR, RAW_DATA_DIR
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.runtime.cli import main
from kdvfs.runtime.cli.offline import gpus as gpus_cmd
from kdvfs.runtime.device import nvml_device as nvml
from kdvfs.runtime.device.errors import (
    DeviceError,
    DeviceIndexError,
    DriverTooOldError,
    NvmlNotSupportedError,
    NvmlPermissionError,
    NvmlUnavailableError,
    translate_nvml_error,
)
from kdvfs.runtime.device.nvml_device import read_local_gpus
from kdvfs.runtime.device.profile_skeleton import skeleton_profile, write_skeleton_yaml
from kdvfs.runtime.testing.fake_nvml import READ_ONLY_CALL, FakeNvml, h200_from_probe

PROBE = json.loads((RAW_DATA_DIR / "h200" / "probe.json").read_text())


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml([h200_from_probe()])


def test_reads_the_recorded_h200_facts(fake: FakeNvml) -> None:
    (gpu,) = read_local_gpus(fake)
    assert (gpu.index, gpu.name, gpu.driver_version) == (0, "NVIDIA H200", "580.159.04")
    assert gpu.memory_clocks_mhz == (3201, 2201)
    assert {mem: list(cores) for mem, cores in gpu.core_clocks_mhz.items()} == \
        {int(mem): cores for mem, cores in PROBE["gfx_clocks"].items()}
    assert (gpu.max_core_mhz, gpu.default_memory_mhz) == (1980, 3201)
    assert (gpu.power_limit_w, gpu.power_limit_range_w) == (700.0, (200.0, 700.0))
    assert gpu.power_draw_w == pytest.approx(76.701) and gpu.is_idle
    assert gpu.sm_count is None and gpu.memory_total_bytes == 143_771 * 2**20
    assert not fake.state.initialised


def test_makes_only_read_only_calls(fake: FakeNvml) -> None:
    read_local_gpus(fake)
    calls = fake.state.calls
    assert calls[0] == "nvmlInit" and calls[-1] == "nvmlShutdown"
    assert all(READ_ONLY_CALL.fullmatch(name) for name in calls), calls
    assert not [name for name in calls if "Set" in name or "Reset" in name]


def test_only_the_clock_setting_class_names_setters() -> None:
    """Every NVML function named in the nvml module outside ``NvmlDevice`` (also on paths the fake does not take)
    is a getter; ``NvmlDevice`` names the clock locks."""
    tree = ast.parse(inspect.getsource(nvml))
    (setting,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "NvmlDevice"]
    tree.body.remove(setting)
    names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr.startswith("nvml")}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert names and all(READ_ONLY_CALL.fullmatch(name) for name in names), names
    assert not {s for s in strings if re.match(r"nvml\w*(Set|Reset)", s)}
    setters = {node.attr for node in ast.walk(setting) if isinstance(node, ast.Attribute)}
    assert {"nvmlDeviceSetGpuLockedClocks", "nvmlDeviceSetMemoryLockedClocks", "nvmlDeviceResetGpuLockedClocks",
            "nvmlDeviceResetMemoryLockedClocks"} <= setters


def test_skeleton_of_fake_h200_matches_shipped_profile(fake: FakeNvml, tmp_path: Path) -> None:
    (gpu,) = read_local_gpus(fake)
    path = tmp_path / "lab-h200.yaml"
    write_skeleton_yaml(skeleton_profile(gpu, "lab-h200"), path)
    written, shipped = load_profile(path), load_profile("h200")
    assert load_yaml(path)["clocks"] == load_yaml(GPU_PROFILE_DIR / "h200.yaml")["clocks"]
    assert written.clocks == shipped.clocks
    assert (written.power.limit_w, written.power.limit_range_w) == (shipped.power.limit_w, shipped.power.limit_range_w)
    assert written.power.idle_w == pytest.approx(76.701)


def test_optional_facts(fake: FakeNvml) -> None:
    fake.state.gpus[0].sm_count = 132
    fake.state.failures["nvmlDeviceGetDefaultApplicationsClock"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    fake.state.failures["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    (gpu,) = read_local_gpus(fake)
    assert gpu.sm_count == 132 and gpu.default_memory_mhz == 3201
    assert gpu.utilization_pct is None and not gpu.is_idle


def test_optional_query_still_reports_real_failures(fake: FakeNvml) -> None:
    fake.state.failures["nvmlDeviceGetAttributes"] = pynvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(DeviceError, match="cannot read the SM count of GPU 0"):
        read_local_gpus(fake)


@pytest.mark.parametrize(("code", "kind", "fix"), [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, NvmlUnavailableError, "install the NVIDIA driver"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, NvmlUnavailableError, "load the NVIDIA driver"),
    (pynvml.NVML_ERROR_NO_PERMISSION, NvmlPermissionError, "CAP_SYS_ADMIN"),
    (pynvml.NVML_ERROR_NOT_SUPPORTED, NvmlNotSupportedError, "does not offer it"),
    (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, DriverTooOldError, "upgrade the driver"),
    (pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, DriverTooOldError, "upgrade the driver"),
    (pynvml.NVML_ERROR_INVALID_ARGUMENT, DeviceIndexError, "GPU index"),
    (pynvml.NVML_ERROR_GPU_IS_LOST, DeviceError, "nvidia-smi"),
])
def test_translate_nvml_error(code: int, kind: type[DeviceError], fix: str) -> None:
    error = translate_nvml_error(pynvml.NVMLError(code), "read the power limit of GPU 0")
    assert type(error) is kind and isinstance(error, KdvfsError)
    message = str(error)
    assert message.startswith("cannot read the power limit of GPU 0: ") and fix in message
    assert f"NVML error {code}" in message and "\n" not in message


def test_no_library_raises_unavailable_without_shutdown(fake: FakeNvml) -> None:
    fake.state.failures["nvmlInit"] = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(NvmlUnavailableError, match="install the NVIDIA driver"):
        read_local_gpus(fake)
    assert fake.state.calls == ["nvmlInit"]


def test_failed_query_still_shuts_nvml_down(fake: FakeNvml) -> None:
    fake.state.failures["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NO_PERMISSION
    with pytest.raises(NvmlPermissionError, match="power draw of GPU 0"):
        read_local_gpus(fake)
    assert fake.state.calls[-1] == "nvmlShutdown" and not fake.state.initialised


def test_gpu_without_memory_clock_list_is_not_supported(fake: FakeNvml) -> None:
    fake.state.gpus[0].memory_clocks_mhz = []
    with pytest.raises(NvmlNotSupportedError, match="no supported memory clocks"):
        read_local_gpus(fake)


def test_default_binding_without_nvml_is_unavailable(nvml_available: bool) -> None:
    if nvml_available:
        pytest.skip("NVML works on this machine")
    with pytest.raises(NvmlUnavailableError):
        read_local_gpus()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["gpus", "local", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_without_nvml_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], nvml_available: bool) -> None:
    if nvml_available:
        pytest.skip("NVML works on this machine")
    code, out, err = _run(capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kdvfs: error: cannot initialise NVML") and "NVIDIA driver" in err


@pytest.fixture
def cli_fake(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    monkeypatch.setattr(gpus_cmd, "read_local_gpus", functools.partial(read_local_gpus, fake))
    return fake


def test_cli_json_and_table(cli_fake: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--json")
    (gpu,) = json.loads(out)
    assert code == 0 and gpu["name"] == "NVIDIA H200" and gpu["memory_clocks_mhz"] == [3201, 2201]
    code, out, _ = _run(capsys)
    assert code == 0 and "NVIDIA H200" in out and "345-1980" in out


def test_cli_writes_skeleton(cli_fake: FakeNvml, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "lab-h200.yaml"
    code, _, err = _run(capsys, "--write", str(path))
    assert code == 0 and str(path) in err
    assert load_profile(path).name == "lab-h200"
    code, _, _ = _run(capsys, "--write", str(path), "--name", "other", "--index", "0")
    assert code == 0 and load_profile(path).name == "other"


def test_cli_bad_index_writes_nothing(cli_fake: FakeNvml, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    code, out, err = _run(capsys, "--write", str(path), "--index", "1")
    assert code == 2 and out == "" and "GPU index 1 is out of range" in err
    assert not path.exists()


def test_cli_fake_without_library_exits_2(cli_fake: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    cli_fake.state.failures["nvmlInit"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    code, _, err = _run(capsys)
    assert code == 2 and err.count("\n") == 1 and "load the NVIDIA driver" in err


@pytest.mark.gpu
def test_real_nvml(tmp_path: Path) -> None:
    gpus = read_local_gpus()
    assert gpus
    for gpu in gpus:
        assert list(gpu.memory_clocks_mhz) == sorted(gpu.memory_clocks_mhz, reverse=True)
        assert all(list(cores) == sorted(cores) for cores in gpu.core_clocks_mhz.values())
        low_w, high_w = gpu.power_limit_range_w
        assert 0 < low_w <= gpu.power_limit_w <= high_w and gpu.power_draw_w > 0
        profile = write_skeleton_yaml(skeleton_profile(gpu, f"local{gpu.index}"), tmp_path / f"local{gpu.index}.yaml")
        assert profile.clocks.memory_mhz == gpu.memory_clocks_mhz
