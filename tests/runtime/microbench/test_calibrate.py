"""``kdvfs calibrate``: fitting synthetic measurements, read-only measurement with a recording fake NVML, and
the clock sweep (only ever against the fake device)."""

from __future__ import annotations

import ast
import inspect
import re
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pynvml
import pytest

from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.cost_model import ClockLimits, CostParams, KernelInputs, self_referenced_power_w
from kdvfs.runtime.capture import capture_boot, capture_launch, cpu_emulation, ncu_run, recording, session
from kdvfs.runtime.cli import main
from kdvfs.runtime.cli.live import calibrate as calibrate_cmd
from kdvfs.runtime.cli.live import capture as capture_cmd
from kdvfs.runtime.device import nvml_device as device_nvml
from kdvfs.runtime.device.errors import NvmlPermissionError
from kdvfs.runtime.device.nvml_device import NvmlDevice, has_clock_permission, read_local_gpus, require_clock_permission
from kdvfs.runtime.microbench import clock_sweep, measure, microbench, profile_fit
from kdvfs.runtime.microbench.clock_sweep import clock_grid, measure_clock_sweep
from kdvfs.runtime.microbench.measure import Measurement
from kdvfs.runtime.microbench.microbench import MICROBENCHMARKS, microbenchmark_features
from kdvfs.runtime.microbench.profile_fit import (
    READ_ONLY_FIXED,
    fit_mapping,
    load_mapping,
    measurements_to_sweep,
    starting_mapping,
)
from kdvfs.runtime.testing.fake_nvml import READ_ONLY_CALL, EnergyFakeNvml, h200_from_probe
from tests.schema_check import strict_loads, validate

SETTERS = ("nvmlDeviceSetMemoryLockedClocks", "nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks",
           "nvmlDeviceResetMemoryLockedClocks")
TRUE_SCALE = {"static_w": 1.25, "core_idle_w": 0.8, "core_sm_w": 0.9, "core_tensor_w": 1.08, "mem_traffic_w": 1.15}
OBSERVED_MHZ = {"gemm_qkv_fwd": 1560, "gemm_fc_fwd": 1515, "gemm_out_fwd": 1485, "flash_attn_fwd": 1785,
                "gelu_bf16": 1935, "softmax_vocab": 1935, "steady_gemm_8192_bf16": 1530}


def synthetic_rows(params: CostParams) -> list[Measurement]:
    """The microbenchmarks at H200-like auto clocks, with the power the cost model gives them under ``params``."""
    limits = ClockLimits(1980.0, 3201.0)
    rows = [Measurement("idle", 345, 3201, 1.0, 0.0, (0.0, 0.0, 0.0)),
            Measurement("idle_with_context", 1980, 3201, 1.0, 0.0, (0.0, 0.0, 0.0))]
    for i, (name, features) in enumerate(microbenchmark_features().items()):
        rows.append(Measurement(name, OBSERVED_MHZ.get(name, 1980), 3201, 1e-4 * (1 + i), 0.0, features))
    columns = np.array([[r.time_s, r.core_mhz, r.mem_mhz, *r.features, np.nan] for r in rows]).T
    inputs = KernelInputs(*columns)
    power = self_referenced_power_w(params, limits, inputs, inputs.core_mhz)
    return [replace(row, power_w=float(p)) for row, p in zip(rows, power, strict=True)]


@pytest.fixture
def h200_gpu() -> object:
    return read_local_gpus(EnergyFakeNvml([h200_from_probe()]))[0]


def test_read_only_fit_recovers_synthetic_parameters(h200_gpu: object) -> None:
    shipped = load_profile("h200")
    truth = replace(CostParams.from_profile(shipped),
                    **{k: getattr(CostParams.from_profile(shipped), k) * v for k, v in TRUE_SCALE.items()})
    mapping = starting_mapping(h200_gpu, "lab-h200")  # type: ignore[arg-type]
    sweep = measurements_to_sweep(synthetic_rows(truth), load_mapping(mapping), "synthetic")
    fitted, result = fit_mapping(mapping, sweep, READ_ONLY_FIXED, "read-only at default clocks on GPU 0", 81.5)
    assert set(result.fitted) == set(TRUE_SCALE) and result.power_mape < 1e-3
    for name in TRUE_SCALE:
        assert getattr(result.params, name) == pytest.approx(getattr(truth, name), rel=0.01), name
        assert fitted["cost_model"][name]["status"] == "calibrated"
    for name in ("voltage_min", "fixed_fraction", "power_window_s", "mem_background_w"):
        entry = fitted["cost_model"][name]
        assert entry["value"] == shipped.cost_model[name].value
        assert entry["source"].startswith("kept from the shipped profile h200: ")
    assert fitted["power"]["idle_w"] == 81.5 and "fitted by `kdvfs calibrate` read-only" in fitted["sources"][-1]
    assert load_mapping(fitted).cost_param("core_sm_w") == pytest.approx(truth.core_sm_w, rel=0.01)


def test_observed_clocks_snap_to_supported_clocks() -> None:
    rows = [Measurement("a", 1567.4, 3199.0, 1e-3, 500.0, (0.5, 0.5, 0.0)),
            Measurement("b", 1000.0, 2210.0, 1e-3, 300.0, (0.5, 0.5, 0.0))]
    sweep = measurements_to_sweep(rows, load_profile("h200"), "test")
    assert list(sweep.core_mhz) == [1560.0, 1005.0] and list(sweep.mem_mhz) == [3201.0, 2201.0]
    assert sweep.kernel_names == ("a", "b") and list(sweep.sm_util) == [0.5, 0.5]


def test_features_of_every_microbenchmark() -> None:
    features = microbenchmark_features()
    assert set(features) == {bench.name for bench in MICROBENCHMARKS}
    assert features["gemm_qkv_fwd"][2] > 0.8 and features["copy_bf16"][1] > 0.85
    assert features["steady_copy_2GiB"] == features["copy_bf16"]
    assert all(0 <= value <= 1 for triple in features.values() for value in triple)


CPU_CALIBRATE = ["calibrate", "--nvml-module", "kdvfs.runtime.testing.nvml", "--device", "cpu", "--scale", "0.01",
                 "--duration-s", "0.05"]


def test_read_only_cli_end_to_end_calls_no_setter(shared_nvml: EnergyFakeNvml, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    output, sweep = tmp_path / "lab.yaml", tmp_path / "lab.sweep.csv"
    code = main([*CPU_CALIBRATE, "-o", str(output), "--save-sweep", str(sweep)])
    out = capsys.readouterr().out
    assert code == 0 and "static_w" in out and "fitted" in out
    profile = load_profile(output)
    assert profile.name == "lab" and profile.cost_model["static_w"].status == "calibrated"
    assert profile.cost_model["voltage_min"].source.startswith("kept from the shipped profile h200")
    assert sweep.read_text().count("\n") == len(MICROBENCHMARKS) + 3
    assert shared_nvml.state.calls and all(READ_ONLY_CALL.fullmatch(name) for name in shared_nvml.state.calls)
    assert not shared_nvml.state.initialised


@pytest.mark.parametrize("module", [measure, microbench, profile_fit, clock_sweep, calibrate_cmd, capture_cmd,
                                    capture_boot, cpu_emulation, capture_launch, ncu_run, recording, session])
def test_only_nvml_device_names_nvml_setters(module: types.ModuleType) -> None:
    tree = ast.parse(inspect.getsource(module))
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and re.match(r"nvml[A-Z]", n.attr)}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert all(READ_ONLY_CALL.fullmatch(name) for name in names) and not strings & set(SETTERS)


def test_clock_permission() -> None:
    assert has_clock_permission(euid=0, status="")
    assert not has_clock_permission(euid=1000, status="CapEff:\t0000000000000000\n")
    assert has_clock_permission(euid=1000, status=f"CapEff:\t{1 << 21:016x}\n")
    with pytest.raises(NvmlPermissionError, match="root or CAP_SYS_ADMIN"):
        require_clock_permission(euid=1000, status="CapEff:\t00000000a80425fb\n")


def test_sweep_without_permission_changes_nothing(shared_nvml: EnergyFakeNvml, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_nvml, "has_clock_permission", lambda *args: False)
    code = main([*CPU_CALIBRATE, "--sweep", "-o", str(tmp_path / "x.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and "needs root or CAP_SYS_ADMIN" in err and err.count("\n") == 1
    assert not set(shared_nvml.state.calls) & set(SETTERS) and not list(tmp_path.iterdir())


def test_clock_grid_of_the_h200() -> None:
    grid = clock_grid(load_profile("h200"), core_points=3)
    assert grid == [(1980, 3201), (1380, 3201), (795, 3201), (1980, 2201), (1380, 2201), (795, 2201)]


def test_sweep_locks_each_pair_and_restores(shared_nvml: EnergyFakeNvml) -> None:
    seen = []

    def measure_here(idle_name: str) -> list[Measurement]:
        seen.append((idle_name, dict(shared_nvml.locked)))
        return []

    with NvmlDevice(0, shared_nvml) as device:
        measure_clock_sweep(device, [(1980, 3201), (990, 2201)], measure_here, settle_s=0)
    assert seen == [("idle@1980:3201", {"core": 1980, "mem": 3201}), ("idle@990:2201", {"core": 990, "mem": 2201})]
    assert [c for c in shared_nvml.state.calls if c in SETTERS][-2:] == list(SETTERS[2:]) and shared_nvml.locked == {}


def test_sweep_restores_clocks_after_an_error(shared_nvml: EnergyFakeNvml) -> None:
    def failing(idle_name: str) -> list[Measurement]:
        raise RuntimeError("benchmark failed")

    with pytest.raises(RuntimeError, match="benchmark failed"), NvmlDevice(0, shared_nvml) as device:
        measure_clock_sweep(device, [(1980, 3201)], failing, settle_s=0)
    assert shared_nvml.state.calls[-3:-1] == list(SETTERS[2:]) and shared_nvml.locked == {}


def test_lock_refused_by_nvml_is_a_permission_error(shared_nvml: EnergyFakeNvml) -> None:
    shared_nvml.state.failures["nvmlDeviceSetMemoryLockedClocks"] = pynvml.NVML_ERROR_NO_PERMISSION
    with pytest.raises(NvmlPermissionError, match="cannot lock the memory clock of GPU 0"), \
            NvmlDevice(0, shared_nvml) as device:
        measure_clock_sweep(device, [(1980, 3201)], lambda name: [], settle_s=0)
    assert "nvmlDeviceResetGpuLockedClocks" not in shared_nvml.state.calls


def test_sweep_cli_on_the_fake_device(shared_nvml: EnergyFakeNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_nvml, "has_clock_permission", lambda *args: True)
    monkeypatch.setattr(microbench, "MICROBENCHMARKS", MICROBENCHMARKS[:2])
    monkeypatch.setattr(clock_sweep, "SETTLE_S", 0.0)
    code = main([*CPU_CALIBRATE, "--sweep", "--core-points", "2", "-o", str(tmp_path / "swept.yaml"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = strict_loads(out)
    validate(result, "calibrate")
    assert result["clock_control"] == "nvml" and len(result["measurements"]) > 0
    locks = [c for c in shared_nvml.state.calls if c == "nvmlDeviceSetGpuLockedClocks"]
    assert len(locks) == 4 and shared_nvml.state.calls.count("nvmlDeviceResetGpuLockedClocks") == 1
    assert shared_nvml.locked == {}
    assert load_profile(tmp_path / "swept.yaml").cost_model["static_w"].status == "calibrated"
