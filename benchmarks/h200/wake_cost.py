"""What one wake of a helper thread costs a launch-bound training thread, by what the helper runs its loop in.

    python -m benchmarks.h200.wake_cost run OUT.json [--seconds 6] [--rounds 2]   # on the GPU machine
    python -m benchmarks.h200.wake_cost report OUT.json [--name wake_cost_h100]   # benchmarks/results/NAME.*

A *training* thread launches small CUDA ops back to back in Python (a launch-bound step: it holds the interpreter
lock all the time it is not in the driver). Beside it, a *helper* wakes every ``period_ms``, works ``work_us`` and
sleeps again, as a controller's thread does at each decision point; each case runs ``--seconds`` and the cases
rotate ``--rounds`` times, the training thread alone first and last in each round. Helpers:

- ``python``: a Python loop (``time.sleep``, then a busy wait on ``time.perf_counter``): each wake takes the
  interpreter lock back from the training thread;
- ``native``: the same loop compiled (numba, ``nogil``: ``usleep`` from the C library and a busy wait on a counted
  loop), which never takes the lock.

The figure is the training thread's launches per second against its runs alone in the same round: its
slowdown (%) and the time it loses per helper wake (us), beside the helper's own CPU per wake
(``time.thread_time``). Read-only: no NVML, no clock touched. Without CUDA (``--cpu``) the ops run on the CPU (a
check of the script, not a figure).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numba

from benchmarks.common.provenance import host, nvidia_smi, provenance, provenance_lines, utc_now, write_results

CASES: tuple[tuple[str, float, float], ...] = (
    ("python", 8.0, 0.0), ("python", 8.0, 50.0), ("python", 8.0, 200.0), ("python", 2.0, 50.0),
    ("native", 8.0, 50.0), ("native", 2.0, 50.0))
"""(helper, period (ms), work per wake (us)) of each case."""
OPS_PER_LOOP = 50

_LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
_usleep = _LIBC.usleep
_usleep.argtypes, _usleep.restype = [ctypes.c_uint], ctypes.c_int


@numba.njit(nogil=True, cache=False)
def _native_loop(wakes: int, period_us: int, spins: int) -> float:
    """``wakes`` times: sleep ``period_us``, then ``spins`` iterations of arithmetic; never holds the lock."""
    total = 0.0
    for _ in range(wakes):
        _usleep(period_us)
        for j in range(spins):
            total += j * 1e-9
    return total


def _spins_per_us() -> float:
    """Iterations of :func:`_native_loop`'s inner loop per microsecond on this CPU."""
    _native_loop(1, 0, 1000)
    began_s = time.perf_counter()
    _native_loop(1, 0, 10_000_000)
    return 10_000_000 / ((time.perf_counter() - began_s) * 1e6)


def _train(stop: threading.Event, out: dict[str, float], device: str) -> None:
    import torch

    x = torch.ones(1024, device=device)
    launches, began_s = 0, time.perf_counter()
    while not stop.is_set():
        for _ in range(OPS_PER_LOOP):
            x = x * 1.0001 + 0.0001
        launches += OPS_PER_LOOP
    if device == "cuda":
        torch.cuda.synchronize()
    out["launches_per_s"] = launches / (time.perf_counter() - began_s)


def _python_helper(stop: threading.Event, out: dict[str, float], period_ms: float, work_us: float) -> None:
    began_cpu_s, wakes = time.thread_time(), 0
    while not stop.is_set():
        time.sleep(period_ms / 1e3)
        until_s = time.perf_counter() + work_us / 1e6
        while time.perf_counter() < until_s:
            pass
        wakes += 1
    out.update(wakes=wakes, helper_cpu_us_per_wake=1e6 * (time.thread_time() - began_cpu_s) / max(wakes, 1))


def _native_helper(out: dict[str, float], seconds: float, period_ms: float, work_us: float, spins_per_us: float
                   ) -> None:
    wakes = int(seconds * 1e3 / (period_ms + work_us / 1e3))
    began_cpu_s = time.thread_time()
    _native_loop(wakes, int(period_ms * 1e3), int(work_us * spins_per_us))
    out.update(wakes=wakes, helper_cpu_us_per_wake=1e6 * (time.thread_time() - began_cpu_s) / max(wakes, 1))


def trial(helper: str | None, period_ms: float, work_us: float, seconds: float, device: str,
          spins_per_us: float) -> dict[str, Any]:
    """One case: the training thread for ``seconds`` beside the helper (None: alone)."""
    stop, trained, helped = threading.Event(), {}, {}
    threads = [threading.Thread(target=_train, args=(stop, trained, device))]
    if helper == "python":
        threads.append(threading.Thread(target=_python_helper, args=(stop, helped, period_ms, work_us)))
    elif helper == "native":
        threads.append(threading.Thread(target=_native_helper,
                                        args=(helped, seconds, period_ms, work_us, spins_per_us)))
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return {"helper": helper, "period_ms": period_ms, "work_us": work_us, "seconds": seconds, **trained, **helped}


def run(out: Path, seconds: float, rounds: int, cpu: bool) -> None:
    """Every case, ``rounds`` times, into ``out`` (JSON)."""
    device, started_utc = ("cpu" if cpu else "cuda"), utc_now()
    spins_per_us = _spins_per_us()
    trial(None, 0.0, 0.0, 1.0, device, spins_per_us)  # torch, its device and the ops made ready: not counted
    trials: list[dict[str, Any]] = []
    for round_ in range(rounds):
        trials.append({"round": round_, **trial(None, 0.0, 0.0, seconds, device, spins_per_us)})
        for helper, period_ms, work_us in CASES:
            trials.append({"round": round_, **trial(helper, period_ms, work_us, seconds, device, spins_per_us)})
        trials.append({"round": round_, **trial(None, 0.0, 0.0, seconds, device, spins_per_us)})
    log = {**host(), "command": " ".join(["python", "-m", "benchmarks.h200.wake_cost", *sys.argv[1:]]),
           "started_utc": started_utc, "device": device, "gpu": nvidia_smi(header=False) if not cpu else None,
           "spins_per_us": spins_per_us, "trials": trials}
    out.write_text(json.dumps(log, indent=1))


def summarise(log: dict[str, Any]) -> list[dict[str, Any]]:
    """Per case the log holds: the training thread's slowdown against its runs alone in the same round (%,
    median over rounds), the time it loses per helper wake (us) and the helper's CPU per wake (us)."""
    rows = []
    for helper, period_ms, work_us in CASES:
        slowdowns, lost_us, cpu_us = [], [], []
        for round_ in sorted({t["round"] for t in log["trials"]}):
            trials = [t for t in log["trials"] if t["round"] == round_]
            alone = statistics.mean(t["launches_per_s"] for t in trials if t["helper"] is None)
            case = next((t for t in trials
                         if (t["helper"], t["period_ms"], t["work_us"]) == (helper, period_ms, work_us)), None)
            if case is None:
                continue
            slowdown = alone / case["launches_per_s"] - 1.0
            slowdowns.append(100 * slowdown)
            lost_us.append(1e6 * slowdown * case["seconds"] / max(case["wakes"], 1))
            cpu_us.append(case["helper_cpu_us_per_wake"])
        if not slowdowns:
            continue
        rows.append({"helper": helper, "period_ms": period_ms, "work_us": work_us,
                     "training_slowdown_pct": statistics.median(slowdowns), "slowdowns_pct": slowdowns,
                     "training_lost_us_per_wake": statistics.median(lost_us),
                     "helper_cpu_us_per_wake": statistics.median(cpu_us)})
    return rows


def report(path: Path, name: str) -> None:
    """``benchmarks/results/NAME.{json,md}`` from a run's log."""
    log = json.loads(path.read_text())
    rows = summarise(log)
    command = f"python -m benchmarks.h200.wake_cost report {path} --name {name}"
    result = {**provenance(command), "device_run": {k: log[k] for k in ("machine", "command", "started_utc", "gpu")},
              "rows": rows}
    lines = [f"# A helper thread's wake against a launch-bound training thread ({log['gpu'] or 'CPU'})", "",
             *provenance_lines(result), f"- device run: `{log['command']}` on `{log['machine']}`, {log['started_utc']}",
             "", "| helper | period (ms) | work per wake (us) | training slowdown % (median; each round) | "
             "training time lost per wake (us) | helper CPU per wake (us) |",
             "| --- | ---: | ---: | --- | ---: | ---: |"]
    for r in rows:
        rounds = ", ".join(f"{s:+.1f}" for s in r["slowdowns_pct"])
        lines.append(f"| {r['helper']} | {r['period_ms']:g} | {r['work_us']:g} | {r['training_slowdown_pct']:+.1f} "
                     f"({rounds}) | {r['training_lost_us_per_wake']:.0f} | {r['helper_cpu_us_per_wake']:.0f} |")
    measured = {(r["helper"], r["period_ms"], r["work_us"]) for r in rows}
    missing = [f"{h} {p:g} ms / {w:g} us" for h, p, w in CASES if (h, p, w) not in measured]
    if missing:
        lines += ["", f"Not in this run: {', '.join(missing)}."]
    write_results(name, result, "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run_parser = sub.add_parser("run")
    run_parser.add_argument("out", type=Path)
    run_parser.add_argument("--seconds", type=float, default=6.0, help="each case's length (s)")
    run_parser.add_argument("--rounds", type=int, default=2)
    run_parser.add_argument("--cpu", action="store_true", help="CPU tensors (a check of the script, no figure)")
    report_parser = sub.add_parser("report")
    report_parser.add_argument("log", type=Path)
    report_parser.add_argument("--name", default="wake_cost_h100", help="results file stem")
    args = parser.parse_args(argv)
    if args.what == "run":
        run(args.out, args.seconds, args.rounds, args.cpu)
    else:
        report(args.log, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
