"""Which NVML GPU a CUDA device is: CUDA_VISIBLE_DEVICES (indices, UUIDs and their prefixes, MIG refused)
and LOCAL_RANK, through the fake NVML's GPUs."""

from __future__ import annotations

import pytest

from kdvfs.runtime.device.errors import DeviceIndexError
from kdvfs.runtime.device.visible import cuda_device_nvml_index, nvml_cuda_device, rank_gpu_index, visible_nvml_indices
from kdvfs.runtime.testing.fake_nvml import EnergyFakeNvml, h200_from_probe

UUIDS = [f"GPU-00000000-0000-0000-0000-{n:012d}" for n in range(4)]


@pytest.mark.parametrize(("visible", "expected"), [
    (None, [0, 1, 2, 3]),
    ("2,0", [2, 0]),
    (" 3 , 1 ", [3, 1]),
    (f"{UUIDS[3]},{UUIDS[1]}", [3, 1]),
    ("GPU-00000000-0000-0000-0000-000000000002", [2]),
    ("", []),
])
def test_visible_devices_map_to_nvml_indices(visible: str | None, expected: list[int]) -> None:
    assert visible_nvml_indices(visible, UUIDS) == expected


@pytest.mark.parametrize(("visible", "message"), [
    ("MIG-4f2a1e7c-0000-0000-0000-000000000000", "MIG instance"),
    ("GPU-00000000-0000-0000-0000-000000000001/1/0", "MIG instance"),
    ("7", "has 4 GPU"),
    ("GPU-00000000", "matches 4 GPUs"),
    ("GPU-ffff", "matches no GPU"),
    ("1,1", "twice"),
])
def test_bad_visible_devices_are_refused(visible: str, message: str) -> None:
    with pytest.raises(DeviceIndexError, match=message):
        visible_nvml_indices(visible, UUIDS)


def test_a_rank_trains_on_the_local_rank_th_visible_gpu() -> None:
    assert cuda_device_nvml_index(1, "3,2", UUIDS) == 2
    with pytest.raises(DeviceIndexError, match="CUDA device 2 is not visible: 2 GPU"):
        cuda_device_nvml_index(2, "3,2", UUIDS)
    nvml = EnergyFakeNvml([h200_from_probe(n) for n in range(4)])
    assert rank_gpu_index(nvml, {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": f"{UUIDS[3]},{UUIDS[0]}"}) == 0
    assert rank_gpu_index(nvml, {"LOCAL_RANK": "3"}) == 3
    assert rank_gpu_index(nvml, {}) == 0
    assert nvml_cuda_device(2, nvml, {"CUDA_VISIBLE_DEVICES": "3,2"}) == 1
    with pytest.raises(DeviceIndexError, match="GPU 0 is not visible"):
        nvml_cuda_device(0, nvml, {"CUDA_VISIBLE_DEVICES": "3,2"})


def test_calibrate_takes_its_gpu_through_the_same_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    from argparse import Namespace

    from kdvfs.runtime.cli.live.calibrate import gpu_and_device

    nvml = EnergyFakeNvml([h200_from_probe(n) for n in range(4)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert gpu_and_device(Namespace(gpu_index=None, device=None), nvml) == (2, "cuda:0")
    assert gpu_and_device(Namespace(gpu_index=None, device="cuda:1"), nvml) == (3, "cuda:1")
    assert gpu_and_device(Namespace(gpu_index=3, device=None), nvml) == (3, "cuda:1")
    with pytest.raises(DeviceIndexError, match="GPU 0 is not visible"):
        gpu_and_device(Namespace(gpu_index=0, device=None), nvml)
