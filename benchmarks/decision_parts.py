"""Where a compiled online decision's time goes, part by part, hot (back to back) on this machine.

    python benchmarks/decision_parts.py [--calls 3000] [--out DIR]
    # writes benchmarks/results/decision_parts.{json,md} (or DIR/...)

The shipped H200 policy on the bundled GPT-3 XL step, at one live state: the whole policy-run decision
(``OnlinePolicy.decide``), the environment's own observation at that state (``observe_live_dynamic``: its
Python path, which a decision no longer takes), the decision's one compiled call (``OnlinePolicy.warm``:
observation, policy run, pair and next change; ``decide`` adds the standing order's hold and the result), the
observation's compiled kernel called directly with its arguments ready (dispatch and kernel) and run 100
times inside one compiled call (the kernel alone, per run), and numba's dispatch of a no-op taking 25 arrays
or 25 floats; then a pure-Python loop of 1,000 additions and the two clock reads a decision point makes
(``perf_counter``, ``thread_time``), to compare machines. Median and p99 per call (us). No GPU needed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np
from online_decision_lock import TRACE, h200_online
from provenance import RESULTS, provenance, provenance_lines, write_results

from kdvfs.agents.learned.online import OnlinePolicy
from kdvfs.envs.env.dynamic_observation import observe_dynamic
from kdvfs.envs.env.live import LiveState

REPEATS = 100
"""Kernel runs inside one compiled call, for the kernel's own time."""


@numba.njit(cache=True)
def _observe_repeated(repeats: int, *args: Any) -> None:
    for _ in range(repeats):
        observe_dynamic(*args)


@numba.njit(cache=True)
def no_op(*args: Any) -> None:
    return None


def per_call(call: Callable[[], Any], calls: int, per: int = 1) -> dict[str, float]:
    """Median and p99 (us) of ``call``'s wall time over ``calls`` calls back to back, divided by ``per``."""
    call()
    times_us = np.empty(calls)
    for n in range(calls):
        began = time.perf_counter()
        call()
        times_us[n] = 1e6 * (time.perf_counter() - began) / per
    return {"median_us": float(np.median(times_us)), "p99_us": float(np.percentile(times_us, 99))}


def python_loop() -> int:
    total = 0
    for n in range(1000):
        total += n
    return total


def parts(online: OnlinePolicy) -> dict[str, Callable[[], Any]]:
    """Each part's call at one live state in the middle of the step."""
    env = online.env
    kernel = len(online.cumulative_s) // 2
    auto_s = float(online.cumulative_s[kernel, 0])
    state = LiveState(kernel, 0, -1, 0.0, auto_s * 1.005, auto_s)
    due_s = iter(range(1, 1 << 30))
    online.begin(0.01)
    env.observe_live_dynamic(state)  # the env now stands at the state
    observe_args = env.compiled_observation_args()
    arrays, floats = tuple(np.zeros(4) for _ in range(25)), tuple(float(n) for n in range(25))
    return {
        "OnlinePolicy.decide (policy run)": lambda: online.decide(state, float(next(due_s))),
        "observe_live_dynamic": lambda: env.observe_live_dynamic(state),
        "OnlinePolicy.warm (observation and policy run)": lambda: online.warm(state),
        "observe_dynamic, called directly": lambda: observe_dynamic(*observe_args),
        f"observe_dynamic alone (x{REPEATS} in one call)": lambda: _observe_repeated(REPEATS, *observe_args),
        "numba dispatch, no-op of 25 arrays": lambda: no_op(*arrays),
        "numba dispatch, no-op of 25 floats": lambda: no_op(*floats),
        "python: 1,000 additions": python_loop,
        "time.perf_counter": time.perf_counter,
        "time.thread_time": time.thread_time,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the results files")
    args = parser.parse_args(argv)
    online = h200_online()
    rows = [{"part": name, **per_call(call, args.calls, REPEATS if "alone" in name else 1)}
            for name, call in parts(online).items()]
    document = {"provenance": provenance("python benchmarks/decision_parts.py " + " ".join(argv)),
                "versions": {"numba": numba.__version__, "numpy": np.__version__}, "trace": TRACE, "rows": rows}
    write_results("decision_parts", document, markdown(document), folder=args.out)
    print(markdown(document))
    return 0


def markdown(document: dict[str, Any]) -> str:
    versions = document["versions"]
    lines = ["# Where a compiled online decision's time goes", "", *provenance_lines(document["provenance"]), "",
             f"numba {versions['numba']}, numpy {versions['numpy']}; the shipped H200 policy on "
             f"`{document['trace']}`, one live state, back to back; per call (us).", "",
             "| part | median | p99 |", "| --- | ---: | ---: |"]
    lines += [f"| {r['part']} | {r['median_us']:.2f} | {r['p99_us']:.2f} |" for r in document["rows"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
