"""Which NVML GPU a CUDA device is: ``CUDA_VISIBLE_DEVICES`` and, under torchrun, ``LOCAL_RANK``.

NVML numbers every GPU of the machine and ignores ``CUDA_VISIBLE_DEVICES``; CUDA numbers only the visible
ones, in the order that variable lists them (indices or UUIDs, a UUID also by a unique prefix). A torchrun
worker trains on CUDA device ``LOCAL_RANK`` (the convention of ``torch.cuda.set_device(local_rank)``), so
its NVML index is the ``LOCAL_RANK``-th visible GPU. Without ``CUDA_VISIBLE_DEVICES`` CUDA device ``i`` is
taken to be NVML GPU ``i`` (the PCI bus order, ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; CUDA's default "fastest
first" order is the same on a node of identical GPUs). MIG instances are refused: kdvfs sets the clocks
of a whole GPU, which a MIG slice shares with others.
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping, Sequence

from kdvfs.runtime.device.errors import DeviceIndexError
from kdvfs.runtime.device.nvml_device import read_gpu_uuids

VISIBLE_VARIABLE = "CUDA_VISIBLE_DEVICES"
MIG_REFUSED = ("{entry!r} in CUDA_VISIBLE_DEVICES is a MIG instance; kdvfs sets the clocks of a whole GPU, which "
               "MIG slices share: list full GPUs (indices or GPU-... UUIDs)")


def _nvml_index(entry: str, uuids: Sequence[str]) -> int:
    """The NVML index one ``CUDA_VISIBLE_DEVICES`` entry names."""
    if entry.startswith("MIG-") or "/" in entry:
        raise DeviceIndexError(MIG_REFUSED.format(entry=entry))
    if entry.isdigit():
        if int(entry) >= len(uuids):
            raise DeviceIndexError(f"CUDA_VISIBLE_DEVICES names GPU {entry}, but this machine has {len(uuids)} "
                                   "GPU(s) (`kdvfs gpus local` lists them)")
        return int(entry)
    matches = [index for index, uuid in enumerate(uuids) if uuid.startswith(entry)]
    if len(matches) != 1:
        found = "no GPU" if not matches else f"{len(matches)} GPUs"
        raise DeviceIndexError(f"CUDA_VISIBLE_DEVICES entry {entry!r} matches {found} of this machine's UUIDs "
                               "(`kdvfs gpus local` lists them)")
    return matches[0]


def visible_nvml_indices(visible: str | None, uuids: Sequence[str]) -> list[int]:
    """The NVML index of each CUDA device (position = CUDA ordinal), given ``CUDA_VISIBLE_DEVICES`` (None:
    unset) and the machine's GPU UUIDs in NVML order."""
    if visible is None:
        return list(range(len(uuids)))
    indices = [_nvml_index(entry.strip(), uuids) for entry in visible.split(",") if entry.strip()]
    if len(set(indices)) != len(indices):
        raise DeviceIndexError(f"CUDA_VISIBLE_DEVICES={visible!r} lists a GPU twice")
    return indices


def cuda_device_nvml_index(cuda_device: int, visible: str | None, uuids: Sequence[str]) -> int:
    """The NVML index of CUDA device ``cuda_device`` (see the module docstring)."""
    indices = visible_nvml_indices(visible, uuids)
    if not 0 <= cuda_device < len(indices):
        shown = "unset" if visible is None else repr(visible)
        raise DeviceIndexError(f"CUDA device {cuda_device} is not visible: {len(indices)} GPU(s) visible "
                               f"(CUDA_VISIBLE_DEVICES {shown}); under torchrun use at most that many processes "
                               "per node")
    return indices[cuda_device]


def local_rank(environ: Mapping[str, str] = os.environ) -> int:
    """This process's ``LOCAL_RANK`` (0 outside torchrun)."""
    return int(environ.get("LOCAL_RANK", "0"))


def rank_gpu_index(nvml: types.ModuleType, environ: Mapping[str, str] = os.environ) -> int:
    """The NVML index of the GPU this process trains on: CUDA device ``LOCAL_RANK`` (0 outside torchrun)."""
    return cuda_device_nvml_index(local_rank(environ), environ.get(VISIBLE_VARIABLE), read_gpu_uuids(nvml))


def nvml_cuda_device(nvml_index: int, nvml: types.ModuleType, environ: Mapping[str, str] = os.environ) -> int:
    """The CUDA ordinal of NVML GPU ``nvml_index`` in this process (an error when it is not visible)."""
    indices = visible_nvml_indices(environ.get(VISIBLE_VARIABLE), read_gpu_uuids(nvml))
    if nvml_index not in indices:
        raise DeviceIndexError(f"GPU {nvml_index} is not visible to CUDA here (CUDA_VISIBLE_DEVICES="
                               f"{environ.get(VISIBLE_VARIABLE)!r}); pick a visible one or widen the variable")
    return indices.index(nvml_index)
