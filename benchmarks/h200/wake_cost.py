"""What one wake of a helper thread costs a launch-bound training thread, by what the helper runs its loop in.

    python -m benchmarks.h200.wake_cost run OUT.json [--blocks 41] [--block-s 0.25]   # on the GPU machine
    python -m benchmarks.h200.wake_cost report OUT.json [--name wake_cost_h100]       # benchmarks/results/NAME.*

A *training* thread launches small CUDA ops back to back in Python (a launch-bound step: it holds the interpreter
lock all the time it is not in the driver). Beside it a *helper* wakes every ``period_ms`` and works ``work_us``, as
a controller's thread does at each decision point: ``none`` (no helper: the method's own spread), ``python`` (a
Python loop, ``time.sleep`` then a busy wait: each wake takes the lock back) or ``native`` (the same loop compiled
with numba, ``nogil``: ``usleep`` and a counted busy loop, never taking the lock while it runs).

A host's launch rate drifts by more than a helper's cost from run to run, so each case interleaves ``--blocks`` (odd)
blocks of ``--block-s``, the helper blocked in the even ones and waking in the odd ones; each on-block's launch rate
is compared with the mean of its two neighbouring off-blocks (a drift linear over three blocks cancels). Figures:
the mean of those slowdowns (%) with a Student-t 95% interval, the training time lost per helper wake (us) and the
helper's CPU per wake (``time.thread_time``). Read-only: no NVML, no clock touched. ``--cpu``: the ops on the CPU
(a check of the script, not a figure).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np

from benchmarks.common.provenance import host, nvidia_smi, utc_now, write_results
from benchmarks.common.run_report import device_report, number_cell, run_report_parser
from kdvfs.runtime.controller.measurement.estimator import t_975

CASES: tuple[tuple[str, float, float], ...] = (
    ("none", 8.0, 0.0), ("python", 8.0, 0.0), ("python", 8.0, 50.0), ("python", 8.0, 200.0),
    ("python", 2.0, 50.0), ("native", 8.0, 50.0), ("native", 2.0, 50.0))
"""(helper, period (ms), work per wake (us)) of each case."""
OPS_PER_LOOP = 50

_LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
_usleep = _LIBC.usleep
_usleep.argtypes, _usleep.restype = [ctypes.c_uint], ctypes.c_int


@numba.njit(nogil=True, cache=False)
def _native_loop(on: np.ndarray, sink: np.ndarray, period_us: int, spins: int, most_wakes: int) -> int:
    """While ``on[0]`` is not 0, at most ``most_wakes`` times: sleep ``period_us``, then ``spins`` iterations of
    arithmetic (their sum kept in ``sink[0]``, so that the compiler cannot drop them); the wakes made. Never holds
    the lock."""
    wakes = 0
    while on[0] != 0 and wakes < most_wakes:
        _usleep(period_us)
        total = sink[0]
        for j in range(spins):
            total += j * 1e-9
        sink[0] = total
        wakes += 1
    return wakes


def _spins_per_us() -> float:
    """Iterations of :func:`_native_loop`'s arithmetic per microsecond on this CPU, timed through the same compiled
    loop (a wake of ten million iterations, its sleep's share negligible)."""
    on, sink = np.ones(1, dtype=np.int64), np.zeros(1)
    _native_loop(on, sink, 0, 1000, 1)  # compiled, not counted
    began_s = time.perf_counter()
    _native_loop(on, sink, 0, 10_000_000, 3)
    return 3 * 10_000_000 / ((time.perf_counter() - began_s) * 1e6)


class Helper:
    """A helper thread that wakes only while :meth:`switch` has it on; ``kind`` as in the module docstring."""

    def __init__(self, kind: str, period_ms: float, work_us: float, spins_per_us: float) -> None:
        self.kind, self.period_ms, self.work_us, self.spins_per_us = kind, period_ms, work_us, spins_per_us
        self.wakes, self.cpu_s = 0, 0.0
        self._on, self._stop = threading.Event(), False
        self._flag, self._sink = np.zeros(1, dtype=np.int64), np.zeros(1)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        if self.kind != "none":
            self._thread.start()

    def switch(self, on: bool) -> None:
        """Wake (True) or block (False) from now on."""
        self._flag[0] = int(on)
        if on:
            self._on.set()
        else:
            self._on.clear()

    def stop(self) -> None:
        self._stop = True
        self.switch(True)
        self._flag[0] = 0
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        began_cpu_s = time.thread_time()
        while True:
            self._on.wait()
            if self._stop:
                break
            if self.kind == "native":
                self.wakes += _native_loop(self._flag, self._sink, int(self.period_ms * 1e3),
                                           int(self.work_us * self.spins_per_us), 2**62)
            else:
                self._python_wakes()
        self.cpu_s = time.thread_time() - began_cpu_s

    def _python_wakes(self) -> None:
        while self._on.is_set() and not self._stop:
            time.sleep(self.period_ms / 1e3)
            until_s = time.perf_counter() + self.work_us / 1e6
            while time.perf_counter() < until_s:
                pass
            self.wakes += 1


def _launcher(device: str) -> Callable[[], None]:
    """``OPS_PER_LOOP`` small ops launched back to back, as a launch-bound step does."""
    import torch

    x = torch.ones(1024, device=device)

    def launch() -> None:
        nonlocal x
        for _ in range(OPS_PER_LOOP):
            x = x * 1.0001 + 0.0001

    return launch


def trial(kind: str, period_ms: float, work_us: float, blocks: int, block_s: float, device: str,
          spins_per_us: float) -> dict[str, Any]:
    """One case: the training thread's launch rate in each of ``blocks`` blocks, the helper on in the odd ones."""
    launch, helper = _launcher(device), Helper(kind, period_ms, work_us, spins_per_us)
    helper.start()
    rates = []
    for block in range(blocks):
        helper.switch(block % 2 == 1)
        launches, began_s = 0, time.perf_counter()
        while (now_s := time.perf_counter()) - began_s < block_s:
            launch()
            launches += OPS_PER_LOOP
        rates.append(launches / (now_s - began_s))
    helper.stop()
    return {"helper": kind, "period_ms": period_ms, "work_us": work_us, "block_s": block_s,
            "launches_per_s": rates, "wakes": helper.wakes,
            "helper_cpu_us_per_wake": 1e6 * helper.cpu_s / helper.wakes if helper.wakes else None}


def run(out: Path, blocks: int, block_s: float, cpu: bool) -> None:
    """Every case, one after the other, into ``out`` (JSON)."""
    device, started_utc = ("cpu" if cpu else "cuda"), utc_now()
    spins_per_us = _spins_per_us()
    trial("none", 0.0, 0.0, 3, block_s, device, spins_per_us)  # torch, its device and the ops made ready
    trials = [trial(kind, period_ms, work_us, blocks, block_s, device, spins_per_us)
              for kind, period_ms, work_us in CASES]
    log = {**host("benchmarks.h200.wake_cost"),
           "started_utc": started_utc, "device": device, "gpu": nvidia_smi(header=False) if not cpu else None,
           "spins_per_us": spins_per_us, "trials": trials}
    out.write_text(json.dumps(log, indent=1))


def summarise(log: dict[str, Any]) -> list[dict[str, Any]]:
    """Per case the log holds: each on-block's slowdown against the mean of its neighbouring off-blocks (%), their
    mean and 95% interval, the training time lost per helper wake (us) and the helper's CPU per wake (us)."""
    rows = []
    for t in log["trials"]:
        rates = t["launches_per_s"]
        slowdowns = [100 * ((rates[i - 1] + rates[i + 1]) / 2 / rates[i] - 1) for i in range(1, len(rates) - 1, 2)]
        if len(slowdowns) < 2:
            continue
        mean = statistics.fmean(slowdowns)
        half = t_975(len(slowdowns) - 1) * statistics.stdev(slowdowns) / math.sqrt(len(slowdowns))
        wakes_per_block = t["wakes"] / len(slowdowns)
        lost_share = mean / (100 + mean)  # of an on-block's time, lost to the helper
        rows.append({"helper": t["helper"], "period_ms": t["period_ms"], "work_us": t["work_us"],
                     "on_blocks": len(slowdowns), "training_slowdown_pct": mean,
                     "training_slowdown_ci95_pct": [mean - half, mean + half],
                     "training_lost_us_per_wake": 1e6 * lost_share * t["block_s"] / wakes_per_block
                     if wakes_per_block else None,
                     "helper_cpu_us_per_wake": t["helper_cpu_us_per_wake"]})
    return rows


def report(path: Path, name: str) -> None:
    """``benchmarks/results/NAME.{json,md}`` from a run's log."""
    log = json.loads(path.read_text())
    rows = summarise(log)
    record, header = device_report("benchmarks.h200.wake_cost", path, name, log)
    result = {**record, "rows": rows}
    lines = [f"# A helper thread's wake against a launch-bound training thread ({log['gpu'] or 'CPU'})", "",
             *header, "", "| helper | period (ms) | work per wake (us) | on-blocks | training slowdown % [95% CI] | "
             "training time lost per wake (us) | helper CPU per wake (us) |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in rows:
        lo, hi = r["training_slowdown_ci95_pct"]
        lines.append(f"| {r['helper']} | {r['period_ms']:g} | {r['work_us']:g} | {r['on_blocks']} | "
                     f"{r['training_slowdown_pct']:+.2f} [{lo:+.2f}, {hi:+.2f}] | "
                     f"{number_cell(r['training_lost_us_per_wake'], '.0f')} | "
                     f"{number_cell(r['helper_cpu_us_per_wake'], '.0f')} |")
    write_results(name, result, "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser, run_parser = run_report_parser(__doc__, "wake_cost_h100")
    run_parser.add_argument("--blocks", type=int, default=41, help="blocks per case, odd (helper on in the odd ones)")
    run_parser.add_argument("--block-s", type=float, default=0.25, help="each block's length (s)")
    run_parser.add_argument("--cpu", action="store_true", help="CPU tensors (a check of the script, no figure)")
    args = parser.parse_args(argv)
    if args.what == "run":
        if args.blocks < 5 or args.blocks % 2 == 0:
            parser.error(f"--blocks must be odd and at least 5, not {args.blocks}")
        run(args.out, args.blocks, args.block_s, args.cpu)
    else:
        report(args.log, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
