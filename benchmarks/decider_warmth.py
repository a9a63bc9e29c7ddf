"""What the decider's warm lead buys a decision, and what polling for the request costs it (no GPU needed).

    python benchmarks/decider_warmth.py [--decisions 300] [--gap-ms 6] [--out DIR]
    # writes benchmarks/results/decider_warmth.{json,md} (or DIR/...)

The shipped H200 policy decides on the bundled GPT-3 XL step, one decision every ``--gap-ms`` (a controlled
step's decision points are ~6 ms apart), at states that move through the step as a controller's do (25
decision points a step). Each row times the decision (``OnlinePolicy.decide``, the policy run) after what the
deciding thread did in the gap:

* ``slept``: slept the whole gap (the decider without a warm lead);
* ``warmed, polled``: slept until 0.5 ms before the decision, ran a throwaway decision at the previous state
  (``OnlinePolicy.warm``) and polled a pipe with ``select`` until the decision (the decider's warm lead);
* ``warmed, spun``: the same, spinning in Python instead of polling (no system calls);
* ``warmed at its own state, polled``: warmed at the decision's own state (the best a warm-up can do);
* ``spun``: spun the whole gap (never slept).

Then through the decider process itself (``DeciderProcess``, the parent sleeping between requests), without
and with the 0.5 ms warm lead: the decision's time in the child and the round trip seen by the parent.
"""

from __future__ import annotations

import argparse
import itertools
import os
import select
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from provenance import RESULTS, provenance, provenance_lines, write_results

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.frozen import FrozenPolicy
from kdvfs.agents.learned.online import OnlinePolicy
from kdvfs.agents.learned.policy_planner import shipped_policy_path
from kdvfs.envs.env.live import LiveState
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.runtime.controller.decider import DeciderProcess
from kdvfs.runtime.controller.decision_records import quantiles

TRACE = "h200/gpt3xl-1layer-b4"
WARM_S = 0.5e-3
POINTS_PER_STEP = 25


def policy_due(n: int) -> float:
    """The step time (s) to pass decision ``n``: a second apart, past every standing order's hold, so that the
    policy runs at each (an advisor read, between policy runs, is cheaper)."""
    return float(n + 1)


def states(online: OnlinePolicy, count: int) -> list[LiveState]:
    """``count`` live states moving through the step, ``POINTS_PER_STEP`` per step, 0.5% late."""
    kernels = len(online.cumulative_s) - 2
    result = []
    for n in range(count):
        kernel = (n % POINTS_PER_STEP) * kernels // POINTS_PER_STEP
        auto_s = float(online.cumulative_s[kernel, 0])
        result.append(LiveState(kernel, 0, -1, 0.0, auto_s * 1.005, auto_s))
    return result


def in_thread(online: OnlinePolicy, gap_s: float, count: int) -> dict[str, list[float]]:
    """Each gap's decision times (us) on this thread, by what the thread did in the gap."""
    read_fd, write_fd = os.pipe()  # never written: select on it returns at its timeout, as the decider's poll

    def poll(until_s: float) -> None:
        while not select.select([read_fd], [], [], 0.0)[0] and time.perf_counter() < until_s:
            pass

    def spin(until_s: float) -> None:
        while time.perf_counter() < until_s:
            pass

    def warmed(wait: Callable[[float], None], own: bool) -> Callable[[LiveState, LiveState, float], None]:
        def gap(previous: LiveState, state: LiveState, due_s: float) -> None:
            time.sleep(max(0.0, due_s - WARM_S - time.perf_counter()))
            online.warm(state if own else previous)
            wait(due_s)
        return gap

    gaps: dict[str, Callable[[LiveState, LiveState, float], None]] = {
        "slept": lambda previous, state, due_s: time.sleep(max(0.0, due_s - time.perf_counter())),
        "warmed, polled": warmed(poll, own=False), "warmed, spun": warmed(spin, own=False),
        "warmed at its own state, polled": warmed(poll, own=True),
        "spun": lambda previous, state, due_s: spin(due_s)}
    walk, result = states(online, count + 1), {}
    for name, gap in gaps.items():
        times_us = []
        online.begin(0.01)
        for n, (previous, state) in enumerate(itertools.pairwise(walk)):
            gap(previous, state, time.perf_counter() + gap_s)
            began_s = time.perf_counter()
            online.decide(state, policy_due(n))
            times_us.append(1e6 * (time.perf_counter() - began_s))
        result[name] = times_us
    os.close(read_fd)
    os.close(write_fd)
    return result


def through_decider(policy: FrozenPolicy, problem: Problem, online: OnlinePolicy, gap_s: float, count: int,
                    warm_s: float) -> dict[str, list[float]]:
    """The decider process's decisions, one per gap, the parent sleeping between: the child's time, its
    polling and the parent's round trip (us)."""
    decider, round_trip_us = DeciderProcess.started(policy, problem, warm_s), []
    try:
        decider.begin(0.01)
        for n, state in enumerate(states(online, count)):
            decider.expect(gap_s)
            time.sleep(gap_s)
            began_s = time.perf_counter()
            decider.decide(state, policy_due(n))
            round_trip_us.append(1e6 * (time.perf_counter() - began_s))
        return {"child_us": decider.compute_us, "spin_us": decider.spin_us, "round_trip_us": round_trip_us}
    finally:
        decider.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=6.0)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the results files")
    args = parser.parse_args(argv)
    profile = load_profile("h200")
    policy = FrozenPolicy.load(shipped_policy_path("h200"), profile)
    problem = Problem.build(open_trace(TRACE), profile, 0.01)
    online = OnlinePolicy(policy, problem)
    online.prepare()
    gap_s = args.gap_ms / 1e3
    rows = [{"where": "this thread", "gap": name, "decide_us": quantiles(times)}
            for name, times in in_thread(online, gap_s, args.decisions).items()]
    for warm_s in (0.0, WARM_S):
        measured = through_decider(policy, problem, online, gap_s, args.decisions, warm_s)
        rows.append({"where": "decider process", "gap": f"warm lead {1e3 * warm_s:g} ms",
                     **{name: quantiles(values) for name, values in measured.items()}})
    document = {"provenance": provenance("python benchmarks/decider_warmth.py " + " ".join(argv)),
                "trace": TRACE, "decisions": args.decisions, "gap_ms": args.gap_ms, "rows": rows}
    write_results("decider_warmth", document, markdown(document), folder=args.out)
    return 0


def _cell(figures: dict[str, float] | None) -> str:
    return "-" if figures is None else f"{figures['median']:.1f} / {figures['p99']:.1f}"


def markdown(document: dict[str, Any]) -> str:
    lines = ["# What the decider's warm lead buys a decision", "", *provenance_lines(document["provenance"]), "",
             f"{document['decisions']} decisions per row on `{document['trace']}` (shipped H200 policy, the policy "
             f"run), one every {document['gap_ms']:g} ms at states moving through the step "
             f"({POINTS_PER_STEP} a step); median / p99 (us).", "",
             "| where | in the gap | decision | polled for it | round trip (parent) |",
             "| --- | --- | --- | --- | --- |"]
    for r in document["rows"]:
        decision = r.get("decide_us", r.get("child_us"))
        lines.append(f"| {r['where']} | {r['gap']} | {_cell(decision)} | {_cell(r.get('spin_us'))} | "
                     f"{_cell(r.get('round_trip_us'))} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
