"""Time a clock lock takes through kdvfs daemon against a direct NVML call, and the reset after a client drops.

On the fake NVML (no GPU needed: what is timed is the daemon's own cost, the socket, the JSON, its thread's
wake-up, which a real GPU's NVML call time adds to both paths alike): a ``kdvfs daemon`` process serving the
fake H200, and in this process ``NvmlDevice.lock_clocks_mhz`` direct and ``DaemonDevice.lock_clocks_mhz``
through the socket, alternating between two supported SM clocks so that every request reaches NVML. Then,
``DROPS`` times, a client process that leased and locked the GPU is SIGKILLed and the time until the daemon
logged the GPU's reset is taken (the kill's instant to the ``drop`` record's ``time``). Writes
``benchmarks/results/daemon_round_trip.json`` and ``.md``:

    python -m benchmarks.fake_gpu.daemon_round_trip
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.common.provenance import provenance, provenance_lines, write_results
from kdvfs.common.paths import REPO_ROOT
from kdvfs.runtime.daemon.client import DaemonDevice
from kdvfs.runtime.device.nvml_device import NvmlDevice, import_nvml

NVML = "kdvfs.runtime.testing.nvml"
REQUESTS = 20_000
WARM_UP = 1_000
DROPS = 30
CLOCKS_MHZ = ((1095, 2201), (1110, 2201))
KDVFS = [sys.executable, "-c", "import sys; from kdvfs.runtime.cli import main; sys.exit(main(sys.argv[1:]))"]
PERMITTED = "import kdvfs.runtime.device.nvml_device as nvml\nnvml.has_clock_permission = lambda *args: True\n"
HOLD = ("import sys, time\nfrom kdvfs.runtime.daemon.client import DaemonConnection\n"
        "c = DaemonConnection(sys.argv[1]); c.request('lease', gpu=0)\n"
        "c.request('lock', gpu=0, core_mhz=1095, mem_mhz=2201); print('locked', flush=True); time.sleep(60)\n")


def _lock_times_us(device: NvmlDevice | DaemonDevice, count: int) -> list[float]:
    """``count`` lock requests' wall times (us), alternating between :data:`CLOCKS_MHZ`, after a warm-up."""
    times = []
    for number in range(WARM_UP + count):
        core_mhz, mem_mhz = CLOCKS_MHZ[number % 2]
        start = time.perf_counter_ns()
        device.lock_clocks_mhz(core_mhz, mem_mhz)
        if number >= WARM_UP:
            times.append((time.perf_counter_ns() - start) / 1e3)
    return times


def _figures(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {"p50_us": statistics.median(ordered), "p99_us": ordered[int(0.99 * (len(ordered) - 1))],
            "mean_us": statistics.fmean(ordered), "requests": len(ordered)}


def _start_daemon(folder: Path, environment: dict[str, str]) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([*KDVFS, "daemon", "--socket", str(folder / "kdvfs.sock"), "--nvml-module", NVML,
                                "--log", str(folder / "daemon.log")], cwd=REPO_ROOT, env=environment,
                               stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while '"start"' not in _text(folder / "daemon.log") and time.monotonic() < deadline:
        time.sleep(0.05)
    return process


def _text(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def _drop_to_reset_ms(folder: Path, environment: dict[str, str]) -> list[float]:
    """For :data:`DROPS` clients: SIGKILL's instant to the daemon's ``drop`` record (reset done), in ms."""
    delays = []
    for _ in range(DROPS):
        client = subprocess.Popen([sys.executable, "-c", HOLD, str(folder / "kdvfs.sock")], stdout=subprocess.PIPE,
                                  env=environment, cwd=REPO_ROOT)
        assert client.stdout is not None and client.stdout.readline().strip() == b"locked"
        killed_s = time.time()
        client.send_signal(signal.SIGKILL)
        client.wait()
        record = None
        while record is None:
            drops = [json.loads(line) for line in _text(folder / "daemon.log").splitlines() if '"drop"' in line]
            record = next((r for r in drops if r["pid"] == client.pid), None)
            time.sleep(0.01)
        assert record["reset"] == {"0": "ok"}, record
        delays.append((datetime.fromisoformat(record["time"]).timestamp() - killed_s) * 1e3)
    return delays


def measure() -> dict[str, Any]:
    """The lock requests' figures direct and through the daemon, and the drop-to-reset delays."""
    with tempfile.TemporaryDirectory(prefix="kdvfs-daemon-bench-") as name:
        folder = Path(name)
        (folder / "sitecustomize.py").write_text(PERMITTED)
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join([name, os.environ.get("PYTHONPATH", "")]),
                       "KDVFS_LEASE_DIR": str(folder / "leases")}
        for variable in ("KDVFS_FAKE_NVML_STATE", "KDVFS_FAKE_NVML_LOG", "KDVFS_DAEMON"):
            environment.pop(variable, None)  # the fake keeps its clocks in memory: no file on the timed path
        os.environ["KDVFS_LEASE_DIR"] = str(folder / "leases")
        nvml = import_nvml(NVML)
        daemon = _start_daemon(folder, environment)
        try:
            with NvmlDevice(0, nvml, check_energy=False) as device:
                direct = _lock_times_us(device, REQUESTS)
            with DaemonDevice(folder / "kdvfs.sock", 0, nvml, check_energy=False) as device:
                device.lease()
                through = _lock_times_us(device, REQUESTS)
            drops = _drop_to_reset_ms(folder, environment)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
    direct_figures, daemon_figures = _figures(direct), _figures(through)
    return {"direct_nvml": direct_figures, "daemon": daemon_figures,
            "added_p50_us": daemon_figures["p50_us"] - direct_figures["p50_us"],
            "added_p99_us": daemon_figures["p99_us"] - direct_figures["p99_us"],
            "drop_to_reset_ms": {"p50": statistics.median(drops), "max": max(drops), "drops": len(drops)}}


def _markdown(result: dict[str, Any]) -> str:
    direct, daemon, drops = result["direct_nvml"], result["daemon"], result["drop_to_reset_ms"]
    return "\n".join([
        "# Daemon round trip", "", *provenance_lines(result["provenance"]), "",
        f"## A clock lock request on the fake H200 ({daemon['requests']:,} requests each, after a warm-up)", "",
        "| path | p50 (us) | p99 (us) | mean (us) |", "| --- | ---: | ---: | ---: |",
        f"| direct NVML (`NvmlDevice`) | {direct['p50_us']:.1f} | {direct['p99_us']:.1f} | {direct['mean_us']:.1f} |",
        f"| through `kdvfs daemon` (`DaemonDevice`) | {daemon['p50_us']:.1f} | {daemon['p99_us']:.1f} | "
        f"{daemon['mean_us']:.1f} |",
        f"| added by the daemon | {result['added_p50_us']:.1f} | {result['added_p99_us']:.1f} | |", "",
        f"## A SIGKILLed client's GPU reset ({drops['drops']} clients)", "",
        f"From the kill to the daemon's logged reset: median {drops['p50']:.1f} ms, at most {drops['max']:.1f} ms.",
        ""])


def main() -> None:
    result = {"provenance": provenance("python -m benchmarks.fake_gpu.daemon_round_trip"), **measure()}
    write_results("daemon_round_trip", result, _markdown(result))
    print(_markdown(result))


if __name__ == "__main__":
    main()
