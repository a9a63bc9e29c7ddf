"""What one online decision costs on the controller's thread, alone and beside a thread that wants the lock.

    python benchmarks/online_decision_lock.py [--decisions 3000] [--out DIR]
    # writes benchmarks/results/online_decision_lock.{json,md} (or DIR/...)

The shipped H200 policy decides on live states of the bundled GPT-3 XL step (``OnlinePolicy.decide``, the
policy run at every other call), one decision every 0.5 ms as the controller's thread would, in two
conditions: alone, and beside a pure-Python busy thread (a CPU-bound training loop: it always wants the
interpreter lock). Two paths: ``online`` (the controller's: the observation without its static part, the
first layer's static share computed once, numpy calls that keep the lock, ``kdvfs.envs.common.locked``) and
``full observation`` (``observe_live`` and ``act``: the whole 1,104-entry observation, whose element-wise
loops over more than 500 entries release the lock). Wall time against the thread's CPU time shows the
waits for the lock; ``over 1 ms`` is the share of decisions that waited at least that long.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from provenance import RESULTS, provenance, provenance_lines, write_results

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.frozen import FrozenPolicy
from kdvfs.agents.learned.online import OnlinePolicy
from kdvfs.agents.learned.policy_planner import shipped_policy_path
from kdvfs.envs.env.live import LiveState
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.bundled import open_trace

TRACE = "h200/gpt3xl-1layer-b4"
PAUSE_S = 0.5e-3


def decide_paths(online: OnlinePolicy) -> dict[str, Callable[[LiveState, bool], Any]]:
    """Each path's decision at a live state (``run``: the policy runs, else its standing order is re-read)."""
    def full(state: LiveState, run: bool) -> Any:
        observation = online.env.observe_live(state)
        return online.policy.act(observation) if run else observation

    due_s = itertools.count(1)  # a second apart: past the standing order's hold, so that the policy runs

    return {"online": lambda state, run: online.decide(state, float(next(due_s)) if run else -1.0),
            "full observation": full}


def measure(decide: Callable[[LiveState, bool], Any], online: OnlinePolicy, decisions: int) -> dict[str, float]:
    """Wall and CPU time (us) of ``decisions`` decisions at states through the step, one every ``PAUSE_S``."""
    kernels = len(online.cumulative_s) - 2
    wall_us, cpu_us = np.empty(decisions), np.empty(decisions)
    for n in range(decisions):
        kernel = (7 * n) % kernels
        auto_s = float(online.cumulative_s[kernel, 0])
        state = LiveState(kernel, 0, -1, 0.0, auto_s * 1.005, auto_s)
        began, began_cpu = time.perf_counter(), time.thread_time()
        decide(state, n % 2 == 1)
        wall_us[n], cpu_us[n] = 1e6 * (time.perf_counter() - began), 1e6 * (time.thread_time() - began_cpu)
        time.sleep(PAUSE_S)
    return {"wall_median_us": float(np.median(wall_us)), "wall_p99_us": float(np.percentile(wall_us, 99)),
            "cpu_median_us": float(np.median(cpu_us)), "cpu_p99_us": float(np.percentile(cpu_us, 99)),
            "over_1ms": float(np.mean(wall_us > 1e3))}


def busy_thread(stop: threading.Event) -> threading.Thread:
    """A thread running Python bytecode until ``stop`` (it never lets go of the lock on its own)."""
    def spin() -> None:
        total = 0
        while not stop.is_set():
            for i in range(1000):
                total += i

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    return thread


def h200_online() -> OnlinePolicy:
    """The shipped H200 policy deciding online on ``TRACE`` at a 1% budget, prepared."""
    profile = load_profile("h200")
    online = OnlinePolicy(FrozenPolicy.load(shipped_policy_path("h200"), profile),
                          Problem.build(open_trace(TRACE), profile, 0.01))
    online.prepare()
    return online


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the results files")
    args = parser.parse_args(argv)
    online = h200_online()
    online.begin(0.01)
    rows = []
    for condition in ("alone", "beside a busy thread"):
        stop = threading.Event()
        thread = busy_thread(stop) if condition != "alone" else None
        for path, decide in decide_paths(online).items():
            rows.append({"condition": condition, "path": path, **measure(decide, online, args.decisions)})
        stop.set()
        if thread is not None:
            thread.join()
    document = {"provenance": provenance("python benchmarks/online_decision_lock.py " + " ".join(argv)),
                "trace": TRACE, "decisions": args.decisions, "switch_interval_s": sys.getswitchinterval(),
                "rows": rows}
    write_results("online_decision_lock", document, markdown(document), folder=args.out)
    return 0


def markdown(document: dict[str, Any]) -> str:
    lines = ["# One online decision on the controller's thread", "", *provenance_lines(document["provenance"]), "",
             f"{document['decisions']} decisions per row on `{document['trace']}` (shipped H200 policy), one every "
             f"{1e3 * PAUSE_S:.1f} ms, the policy run at every other; interpreter switch interval "
             f"{1e3 * document['switch_interval_s']:.0f} ms.", "",
             "| condition | path | wall median (us) | wall p99 (us) | CPU median (us) | CPU p99 (us) | over 1 ms |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in document["rows"]:
        lines.append(f"| {r['condition']} | {r['path']} | {r['wall_median_us']:.1f} | {r['wall_p99_us']:.1f} | "
                     f"{r['cpu_median_us']:.1f} | {r['cpu_p99_us']:.1f} | {100 * r['over_1ms']:.1f}% |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
