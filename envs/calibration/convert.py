"""Converters from published and bundled measurements to the sweep schema of ``kdvfs.envs.calibration.sweep``.

* :func:`convert_wang_chu`: the per-kernel core x memory sweeps of Wang & Chu (ICPADS 2018) for the
  GTX 980 and GTX 1080 Ti (``data/raw/public``). SM utilisation is the executed IPC over the SM's issue
  width (4 warp schedulers) times the fraction of SMs active (``sm_activity``/``sm_efficiency``); DRAM
  utilisation is the measured DRAM read + write throughput over the peak of the row's memory clock
  (``mem_mhz * 2 transfers * bus bytes``).
* :func:`convert_h200_default`: the H200 default-clock ("auto") data (``data/raw/h200``): the 11
  microbenchmarks of ``power_micro.json`` at their observed SM clocks, the steady GEMM and copy loops and
  idle power of ``probe.json`` (at the idle SM clock), and ``power_micro.json``'s idle power with a CUDA
  context open, taken to be at the maximum SM clock (nvidia-smi showed 122 W idle at 1980 MHz,
  ``smi_state.txt``). Each microbenchmark takes its utilisations from the Nsight Compute row of the
  matching kernel of the GPT-3-XL layer (same shapes: d=2048, 8192 tokens), listed in ``H200_NCU_MATCH``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from kdvfs.common.files import read_input, read_text
from kdvfs.envs.calibration.sweep import Sweep, SweepError
from kdvfs.envs.trace.ncu import NcuKernel, read_ncu_csv

WANG_CHU_BUS_BYTES = {"gtx980": 32, "gtx1080ti": 44}
"""Memory bus width in bytes (256-bit GTX 980, 352-bit GTX 1080 Ti; NVIDIA specifications)."""
ISSUE_WIDTH_IPC = 4.0
"""Instructions per cycle per SM at full issue rate (4 warp schedulers on Maxwell and Pascal)."""

H200_NCU_MATCH = {
    "gemm_qkv_fwd": 8, "flash_attn_fwd": 9, "gemm_fc_fwd": 18, "gemm_out_fwd": 22, "layernorm_fp32": 4,
    "gelu_bf16": 19, "add_fp32": 57, "softmax_vocab": 28, "copy_bf16": 25, "adamw_fused": 103,
}
"""power_micro.json class -> row of ncu_gpt3xl_1layer.csv.gz (0-based kernel order) running the same kernel
template on the same shapes (e.g. add_fp32 is the contiguous ``vectorized_elementwise_kernel<4,
CUDAFunctor_add<float>>``, not the broadcasting ``elementwise_kernel`` of the position-embedding add)."""
H200_FP32_GEMM_FEATURES = (0.9, 0.05, 0.0)
"""(sm, dram, tensor) of the fp32 2048^3 GEMM, which no ncu export covers: estimate (FMA-bound SIMT GEMM)."""
_STEADY = {"steady_gemm_8192_bf16": "gemm_qkv_fwd", "steady_copy_2GiB": "copy_bf16"}


def _sweep(source: str, records: list[tuple[str, float, float, float, float, float, float, float]]) -> Sweep:
    names: dict[str, int] = {}
    index = [names.setdefault(r[0], len(names)) for r in records]
    columns = np.asarray([r[1:] for r in records], dtype=np.float64).T
    return Sweep(source, tuple(names), np.asarray(index), *columns)


def convert_wang_chu(path: Path, gpu: str) -> Sweep:
    """Convert one of Wang & Chu's ``*-dvfs-sweep.csv`` files (``gpu`` is ``gtx980`` or ``gtx1080ti``)."""
    if gpu not in WANG_CHU_BUS_BYTES:
        raise SweepError(f"{path}: unknown GPU {gpu!r} for this converter; use one of {sorted(WANG_CHU_BUS_BYTES)}")
    rows = list(csv.DictReader(read_input(Path(path), SweepError).splitlines()))
    required = {"appName", "kernel", "argNo", "coreF", "memF", "time/ms", "power/W", "dram_read_throughput",
                "dram_write_throughput"}
    if not rows or not required <= set(rows[0]):
        raise SweepError(f"{path}: not a Wang & Chu sweep (needs columns {sorted(required)})")
    records = []
    for line, row in enumerate(rows, start=2):
        try:
            records.append(_wang_chu_record(row, gpu))
        except (TypeError, ValueError):
            raise SweepError(f"{path}: row {line}: missing or non-numeric values; the file is damaged or "
                             "truncated: take a fresh copy of the published CSV") from None
    return _sweep(str(path), records)


def _wang_chu_record(row: dict[str, str], gpu: str) -> tuple[str, float, float, float, float, float, float, float]:
    """One sweep row from a Wang & Chu row (raises TypeError/ValueError on missing or bad cells)."""
    mem_mhz = float(row["memF"])
    peak_gb_s = mem_mhz * 2 * WANG_CHU_BUS_BYTES[gpu] / 1e3
    dram_gb_s = float(row["dram_read_throughput"]) + float(row["dram_write_throughput"])
    ipc = float(row.get("executed_ipc") or row.get("ipc") or 0.0)
    active = float(row.get("sm_activity") or row.get("sm_efficiency") or 0.0)
    return (f"{row['appName']}/{row['kernel']}/{row['argNo']}", float(row["coreF"]), mem_mhz,
            float(row["time/ms"]) / 1e3, float(row["power/W"]),
            min(1.0, active * ipc / ISSUE_WIDTH_IPC), min(1.0, dram_gb_s / peak_gb_s), 0.0)




def _features(kernel: NcuKernel) -> tuple[float, float, float]:
    return kernel.sm_util, kernel.dram_util, kernel.tensor_util or 0.0


def _load_json(path: Path) -> Any:
    try:
        return json.loads(read_text(path))
    except (OSError, ValueError) as error:
        raise SweepError(f"{path}: cannot be read as JSON ({error})") from None


def convert_h200_default(raw_dir: Path) -> Sweep:
    """Build the H200 default-clock calibration sweep from ``power_micro.json``, ``probe.json`` and ncu."""
    raw_dir = Path(raw_dir)
    micro = _load_json(raw_dir / "power_micro.json")
    probe = _load_json(raw_dir / "probe.json")
    ncu = read_ncu_csv(raw_dir / "ncu_gpt3xl_1layer.csv.gz")
    mem_mhz = float(probe["max_clocks"]["mem"])
    features = {name: _features(ncu[row]) for name, row in H200_NCU_MATCH.items()}
    features["gemm_fp32_2048"] = H200_FP32_GEMM_FEATURES
    records = []
    for name, entry in micro.items():
        if isinstance(entry, dict):
            records.append((name, float(entry["sm_clock_med"]), mem_mhz, entry["us_per_call"] / 1e6,
                            float(entry["avg_W"]), *features[name]))
    for name, like in _STEADY.items():
        entry = probe[name]
        records.append((name, float(entry["sm_clock_med"]), mem_mhz, float(entry["s_per_iter"]),
                        float(entry["avg_W"]), *features[like]))
    idle_core = float(probe["idle_clocks"]["sm"])
    records.append(("idle", idle_core, mem_mhz, 1.0, probe["idle_power_mW"] / 1e3, 0.0, 0.0, 0.0))
    max_core = float(probe["max_clocks"]["sm"])
    records.append(("idle_with_context", max_core, mem_mhz, 1.0, float(micro["idle_W"]), 0.0, 0.0, 0.0))
    return _sweep(f"{raw_dir} (power_micro.json, probe.json, ncu_gpt3xl_1layer.csv.gz)", records)
