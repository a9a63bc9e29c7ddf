"""``kdvfs calibrate --gpu-index I -o profile.yaml``: fit a GPU profile from microbenchmarks on this GPU.

READ-ONLY by default: the microbenchmarks run at the GPU's own default clocks and NVML is only read
(energy counter, clocks); no clock, power-limit, persistence or application-clock setting is changed, no
``nvmlDeviceSet*`` or ``nvmlDeviceReset*`` function is called. ``--sweep`` (explicit, and only with root
or CAP_SYS_ADMIN, or through ``kdvfs daemon`` with ``--daemon``/``KDVFS_DAEMON``) locks a grid of clock pairs
through :mod:`kdvfs.runtime.device.nvml_device` (or the daemon), which restores the clocks afterwards. Without
``--sweep`` the daemon is not used: nothing is changed.
"""

from __future__ import annotations

import argparse
import os
import types
from pathlib import Path
from typing import Any

from kdvfs.common.files import write_text_atomic
from kdvfs.envs.calibration.sweep import sweep_to_csv
from kdvfs.runtime.cli.arguments import add_output, check_output_file
from kdvfs.runtime.cli.live.daemon import add_daemon_option
from kdvfs.runtime.cli.render import console, print_json
from kdvfs.runtime.daemon.client import DaemonDevice, clock_control, daemon_socket
from kdvfs.runtime.device.errors import DeviceIndexError
from kdvfs.runtime.device.nvml_device import (
    LocalGpu,
    NvmlDevice,
    import_nvml,
    read_gpu_uuids,
    read_local_gpus,
    require_clock_permission,
)
from kdvfs.runtime.device.visible import VISIBLE_VARIABLE, cuda_device_nvml_index, nvml_cuda_device


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("calibrate", help="fit a GPU profile from microbenchmarks (read-only by default)")
    parser.add_argument("--gpu-index", type=int, help="NVML index of the GPU (default: CUDA device 0's, through "
                                                      "CUDA_VISIBLE_DEVICES)")
    add_output(parser, "GPU profile to write (.yaml)", required=True)
    parser.add_argument("--name", help="profile name (default: the output file name without .yaml)")
    parser.add_argument("--duration-s", type=float, default=3.0, help="seconds per measurement (default 3)")
    parser.add_argument("--save-sweep", type=Path, metavar="CSV", help="also write the measurements as a sweep")
    parser.add_argument("--sweep", action="store_true",
                        help="lock a grid of clock pairs and fit every parameter (needs root; restores clocks)")
    parser.add_argument("--core-points", type=int, default=5, help="core clocks per memory clock with --sweep")
    parser.add_argument("--device", help="torch device of the GPU (default: that of --gpu-index, else cuda:0)")
    parser.add_argument("--scale", type=float, default=1.0, help="shrink the microbenchmarks' shapes (tests)")
    parser.add_argument("--nvml-module", default="pynvml", help="NVML binding to import (default pynvml)")
    add_daemon_option(parser, "with --sweep, lock the clocks")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


def _local_gpu(nvml: types.ModuleType, index: int) -> LocalGpu:
    gpus = read_local_gpus(nvml)
    if not 0 <= index < len(gpus):
        raise DeviceIndexError(f"GPU index {index} is out of range: this machine has {len(gpus)} GPU(s); pick one "
                               "listed by `kdvfs gpus local`")
    return gpus[index]


def gpu_and_device(args: argparse.Namespace, nvml: types.ModuleType) -> tuple[int, str]:
    """The NVML index and the torch device of the GPU to calibrate, one from the other through
    ``CUDA_VISIBLE_DEVICES`` (:mod:`kdvfs.runtime.device.visible`): NVML numbers every GPU, CUDA the visible ones."""
    if args.gpu_index is not None:
        return args.gpu_index, args.device or f"cuda:{nvml_cuda_device(args.gpu_index, nvml)}"
    device = args.device or "cuda:0"
    ordinal = int(device.partition(":")[2] or 0)
    return cuda_device_nvml_index(ordinal, os.environ.get(VISIBLE_VARIABLE), read_gpu_uuids(nvml)), device


def _progress(row: Any) -> None:
    console.print(f"  {row.kernel:<24} {row.time_s * 1e6:>12.1f} us  {row.power_w:>6.1f} W  "
                  f"{row.core_mhz:>6.0f} / {row.mem_mhz:.0f} MHz")


def _measure(args: argparse.Namespace, nvml: types.ModuleType, mapping: dict[str, Any]) -> list[Any]:
    """Every measurement row: at default clocks, or at each pair of the clock grid with ``--sweep``."""
    import torch

    from kdvfs.runtime.microbench.clock_sweep import clock_grid, measure_clock_sweep
    from kdvfs.runtime.microbench.measure import measure_at_default_clocks, measure_benchmark, measure_idle
    from kdvfs.runtime.microbench.microbench import MICROBENCHMARKS
    from kdvfs.runtime.microbench.profile_fit import load_mapping

    device = torch.device(args.device)
    progress = _progress if not args.json else (lambda row: None)
    socket_path = daemon_socket(args.daemon) if args.sweep else None
    with (NvmlDevice(args.gpu_index, nvml) if socket_path is None else DaemonDevice(socket_path, args.gpu_index, nvml)
          ) as gpu:
        if socket_path is not None:
            require_clock_permission(allowed=gpu.has_clock_permission())
        if not args.sweep:
            return measure_at_default_clocks(MICROBENCHMARKS, device, gpu, args.duration_s, args.scale, progress)

        def at_locked_clocks(idle_name: str) -> list[Any]:
            rows = [measure_idle(idle_name, gpu, args.duration_s)]
            rows += [measure_benchmark(bench, device, gpu, args.duration_s, args.scale) for bench in MICROBENCHMARKS]
            for row in rows:
                progress(row)
            return rows

        grid = clock_grid(load_mapping(mapping), args.core_points)
        return measure_clock_sweep(gpu, grid, at_locked_clocks)


def _print_result(path: Path, mapping: dict[str, Any], fitted: tuple[str, ...], power_mape: float) -> None:
    console.print(f"wrote {path}: GPU profile {mapping['name']!r} of {mapping['model']}")
    for name, entry in mapping["cost_model"].items():
        marker = "fitted" if name in fitted else f"kept ({entry['status']})"
        console.print(f"  {name:<24} {entry['value']:>12.5g}  {marker}")
    console.print(f"in-sample power error from utilisations only: {power_mape:.1%}")


def run(args: argparse.Namespace) -> int:
    from kdvfs.runtime.microbench.profile_fit import (
        READ_ONLY_FIXED,
        fit_mapping,
        load_mapping,
        measurements_to_sweep,
        starting_mapping,
        write_calibrated,
    )

    for output in (args.output, args.save_sweep):
        check_output_file(output)
    nvml = import_nvml(args.nvml_module)
    args.gpu_index, args.device = gpu_and_device(args, nvml)
    gpu = _local_gpu(nvml, args.gpu_index)
    if args.sweep and daemon_socket(args.daemon) is None:
        require_clock_permission()
    mapping = starting_mapping(gpu, args.name or args.output.stem)
    rows = _measure(args, nvml, mapping)
    how = "with locked clock sweeps" if args.sweep else "read-only at default clocks"
    sweep = measurements_to_sweep(rows, load_mapping(mapping), f"measurements on GPU {gpu.index} ({gpu.name}), {how}")
    idle = next((row.power_w for row in rows if row.kernel == "idle"), None)
    mapping, result = fit_mapping(mapping, sweep, () if args.sweep else READ_ONLY_FIXED,
                                  f"{how} on GPU {gpu.index}", idle)
    if args.save_sweep:
        write_text_atomic(args.save_sweep, sweep_to_csv(sweep))
    write_calibrated(mapping, args.output)
    if args.json:
        control = clock_control(daemon_socket(args.daemon)) if args.sweep else None  # None: no clock changed
        print_json({"profile": str(args.output), "clock_control": control, "fitted": list(result.fitted),
                    "power_mape": result.power_mape,
                    "time_mape": result.time_mape, "cost_model": mapping["cost_model"],
                    "measurements": [vars(row) for row in rows]})
    else:
        _print_result(args.output, mapping, result.fitted, result.power_mape)
    return 0

