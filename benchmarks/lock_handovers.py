"""What a pipe write costs a training thread that wants the interpreter lock (no GPU needed).

    python benchmarks/lock_handovers.py [--seconds 2] [--rounds 3] [--out DIR]
    # writes benchmarks/results/lock_handovers.{json,md} (or DIR/...)

The main thread stands for a training loop bound by its Python: it spins in Python for ``--seconds``. A
second thread stands for the controller's: every 2 ms it wakes, runs a little Python and makes a decision
point's pipe traffic with an echo process (a request and its answer, then the one-way note of when the next
request comes), writing either with ``os.write`` (which lets go of the interpreter lock around the system
call) or with the decider's :func:`~kdvfs.runtime.controller.decider.write_holding_lock`, or makes no pipe
traffic at all. Per variant, interleaved over ``--rounds``: the main thread's voluntary context switches per
decision point (each one a wait for the lock: a hand-over), the points the second thread managed (a thread
that gave the lock away waits up to the switch interval, 5 ms, to get it back) and the main thread's
Python loop iterations per second (its progress).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from provenance import RESULTS, provenance, provenance_lines, write_results

from kdvfs.runtime.controller.decider import write_holding_lock

GAP_S = 2e-3
REQUEST, NOTE, ANSWER = b"\x01" * 64, b"\x03" * 64, 32
ECHO = "import os\nwhile (b := os.read(0, 64)):\n    if b[0] == 1:\n        os.write(1, bytes(32))\n"


def voluntary_switches() -> int:
    """The calling thread's voluntary context switches so far (Linux ``/proc/thread-self/status``)."""
    status = Path("/proc/thread-self/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def decision_points(write: Callable[[int, bytes], Any] | None, to_fd: int, from_fd: int, stop: threading.Event,
                    done: list[int]) -> None:
    """The controller-like thread: a point every ``GAP_S`` until ``stop``, counted in ``done[0]``."""
    wake = threading.Event()
    while not stop.is_set():
        wake.wait(GAP_S)
        sum(range(200))  # the point's own Python
        if write is not None:
            write(to_fd, REQUEST)
            os.read(from_fd, ANSWER)  # waits for the answer, the lock let go (as the decider's parent does)
            write(to_fd, NOTE)
        done[0] += 1


def measure(write: Callable[[int, bytes], Any] | None, seconds: float, to_fd: int, from_fd: int) -> dict[str, float]:
    """One variant for ``seconds``: the main thread's switches per point, points per second, its loops per s."""
    stop, done = threading.Event(), [0]
    side = threading.Thread(target=decision_points, args=(write, to_fd, from_fd, stop, done))
    side.start()
    began_switches, began_s, loops = voluntary_switches(), time.perf_counter(), 0
    while time.perf_counter() - began_s < seconds:
        loops += 1
    switches = voluntary_switches() - began_switches
    stop.set()
    side.join()
    return {"switches_per_point": switches / max(1, done[0]), "points_per_s": done[0] / seconds,
            "main_loops_per_s": loops / seconds}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the results files")
    args = parser.parse_args(argv)
    echo = subprocess.Popen([sys.executable, "-c", ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert echo.stdin is not None and echo.stdout is not None
    to_fd, from_fd = echo.stdin.fileno(), echo.stdout.fileno()
    variants: dict[str, Callable[[int, bytes], Any] | None] = {
        "no pipe traffic": None, "os.write": os.write, "write_holding_lock": write_holding_lock}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    try:
        for _ in range(args.rounds):
            for name, write in variants.items():
                runs[name].append(measure(write, args.seconds, to_fd, from_fd))
    finally:
        echo.stdin.close()
        echo.wait()
    rows = [{"variant": name, **{key: statistics.median(run[key] for run in measured) for key in measured[0]}}
            for name, measured in runs.items()]
    document = {"provenance": provenance("python benchmarks/lock_handovers.py " + " ".join(argv)),
                "seconds": args.seconds, "rounds": args.rounds, "gap_ms": 1e3 * GAP_S, "rows": rows}
    write_results("lock_handovers", document, markdown(document), folder=args.out)
    return 0


def markdown(document: dict[str, Any]) -> str:
    lines = ["# Interpreter-lock hand-overs of a decision point's pipe writes", "",
             *provenance_lines(document["provenance"]), "",
             f"A thread spinning in Python beside one that makes a decision point every {document['gap_ms']:g} ms "
             f"(medians over {document['rounds']} interleaved rounds of {document['seconds']:g} s; see the "
             "script's docstring).", "",
             "| pipe writes | spinning thread's voluntary switches per point | points per s | spinning thread's "
             "loops per s (millions) |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {row['variant']} | {row['switches_per_point']:.2f} | {row['points_per_s']:.0f} | "
              f"{row['main_loops_per_s'] / 1e6:.2f} |" for row in document["rows"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
