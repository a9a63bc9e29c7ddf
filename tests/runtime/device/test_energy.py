"""Energy over a window from a quantised NVML energy counter; the read-only GPU reader."""

from __future__ import annotations

import ast
import inspect
import time

import pynvml
import pytest

from kdvfs.runtime.device import energy, nvml_device
from kdvfs.runtime.device.energy import Sample, WindowSampler, read_window
from kdvfs.runtime.device.errors import DeviceError, NvmlNotSupportedError, NvmlUnavailableError
from kdvfs.runtime.device.nvml_device import GpuReader, import_nvml
from kdvfs.runtime.testing.fake_nvml import READ_ONLY_CALL, EnergyFakeNvml, h200_from_probe


def quantised_samples(power_w: float, update_hz: float, start_s: float, end_s: float, poll_s: float = 0.01,
                      offset_s: float = 0.037) -> list[Sample]:
    """Samples every ``poll_s`` of a counter that integrates ``power_w`` but publishes ``update_hz`` times a second."""
    samples, t = [], start_s
    while t <= end_s + 1e-12:
        published = int((t + offset_s) * update_hz) / update_hz - offset_s
        samples.append(Sample(t, 5000.0 + power_w * published, 1500.0, 3201.0))
        t += poll_s
    return samples


def test_power_between_counter_updates_removes_quantisation() -> None:
    samples = quantised_samples(650.0, 10.0, 0.0, 2.03)
    naive_w = (samples[-1].energy_j - samples[0].energy_j) / (samples[-1].time_s - samples[0].time_s)
    reading = read_window(samples)
    assert abs(naive_w / 650 - 1) > 0.01
    assert reading.avg_power_w == pytest.approx(650.0, rel=0.01)
    assert reading.counter_updates == 20 and reading.elapsed_s == pytest.approx(2.03)
    assert (reading.sm_mhz, reading.mem_mhz) == (1500.0, 3201.0)
    assert reading.energy_j == pytest.approx(650.0 * 2.03, rel=0.01)


def test_window_with_one_update_uses_its_edges() -> None:
    samples = [Sample(0.0, 10.0, 1980, 3201), Sample(0.5, 10.0, 1980, 3201), Sample(1.0, 110.0, 1980, 3201)]
    assert read_window(samples).avg_power_w == pytest.approx(100.0)


@pytest.mark.parametrize("samples", [
    [Sample(0.0, 10.0, 1980, 3201)],
    [Sample(0.0, 10.0, 1980, 3201), Sample(0.0, 12.0, 1980, 3201)],
    [Sample(0.0, 10.0, 1980, 3201), Sample(0.05, 10.0, 1980, 3201)],
])
def test_degenerate_windows_are_errors(samples: list[Sample]) -> None:
    with pytest.raises(DeviceError, match="longer window"):
        read_window(samples)


def test_sampler_reads_the_fake_counter() -> None:
    fake = EnergyFakeNvml([h200_from_probe()], power_w=300.0)
    with GpuReader(0, fake) as reader:
        sampler = WindowSampler(reader, interval_s=0.005)
        sampler.start()
        assert sampler.running
        time.sleep(0.2)
        reading = sampler.stop()
    assert reading.avg_power_w == pytest.approx(300.0, rel=0.05) and reading.sm_mhz == 1980.0
    assert reading.counter_updates > 5 and not sampler.running
    assert all(READ_ONLY_CALL.fullmatch(name) for name in fake.state.calls)
    assert fake.state.calls[-1] == "nvmlShutdown"


def test_sampler_reraises_a_failure_of_its_thread() -> None:
    fake = EnergyFakeNvml([h200_from_probe()])
    with GpuReader(0, fake) as reader:
        sampler = WindowSampler(reader, interval_s=0.002)
        sampler.start()
        fake.state.failures["nvmlDeviceGetClockInfo"] = pynvml.NVML_ERROR_GPU_IS_LOST
        time.sleep(0.05)
        with pytest.raises(DeviceError, match="cannot read the SM clock of GPU 0"):
            sampler.stop()


def test_reader_without_energy_counter_fails_early_and_shuts_down() -> None:
    fake = EnergyFakeNvml([h200_from_probe()])
    fake.state.failures["nvmlDeviceGetTotalEnergyConsumption"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(NvmlNotSupportedError, match="total-energy counter of GPU 0"), GpuReader(0, fake):
        pass
    assert fake.state.calls[-1] == "nvmlShutdown" and not fake.state.initialised


def test_reader_reads_the_power_limits_or_none_where_the_gpu_offers_none() -> None:
    fake = EnergyFakeNvml([h200_from_probe()])
    with GpuReader(0, fake) as reader:
        limits = reader.power_limits()
        fake.state.failures["nvmlDeviceGetEnforcedPowerLimit"] = pynvml.NVML_ERROR_NOT_SUPPORTED
        assert reader.power_limits() is None
    assert limits is not None and (limits.limit_w, limits.range_w) == (700.0, (200.0, 700.0))


def test_unknown_binding_is_unavailable() -> None:
    with pytest.raises(NvmlUnavailableError, match="cannot import the NVML binding 'no_such_nvml'"):
        import_nvml("no_such_nvml")


@pytest.mark.parametrize("module", [nvml_device.GpuReader, nvml_device.read_local_gpus, energy])
def test_readers_name_no_setter(module: object) -> None:
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr.startswith("nvml")}
    assert all(READ_ONLY_CALL.fullmatch(name) for name in names), names
