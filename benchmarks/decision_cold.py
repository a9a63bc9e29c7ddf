"""What a gap between decisions costs a compiled online decision, and what keeping the core busy buys it.

    python benchmarks/decision_cold.py [--calls 200] [--gap-ms 6] [--only WORDS] [--out DIR]
    # writes benchmarks/results/decision_cold.{json,md} (or DIR/...)

A controller decides once every few milliseconds; back to back its decision is ~4x faster than in a run
(``decision_parts``, ``decider_warmth``). Each cell here times one part after one kind of gap, ``--calls``
times, on the shipped H200 policy and the bundled GPT-3 XL step, at states moving through the step (25 a
step). The parts separate the decision from work that touches no data:

* ``decide``: ``OnlinePolicy.decide`` with the policy run (the controller's decision, less its request);
* ``observation and policy run`` (``OnlinePolicy.warm``), ``observation`` (``observe_live_dynamic``) and
  ``compiled observation`` (its compiled kernel alone, with its arguments made ahead): the decision's parts,
  to see which of them a gap slows;
* ``dispatch of a decision's arguments``: numba's dispatch of a compiled no-op taking arguments like a
  decision's before they were bound in one object (30 small arrays, two of them in tuples as the policy's
  layers are, 17 scalars; since 2e14cfb a decision passes one bound object and 11 scalars);
* ``python 1,000 additions``: interpreter work touching no data;
* ``compiled arithmetic``: a compiled loop of 20,000 dependent float operations touching no memory.

The gaps: ``back to back``; ``spun in python`` or ``spun compiled`` for the whole gap (never sleeping, no
system calls); ``slept`` the whole gap; ``slept, then a decision W us before`` (a throwaway decision at the
previous state, ``OnlinePolicy.warm``, then spun in Python until due); ``napped N us at a time`` (the gap
slept in naps of at most N us). A host whose cores stay warm through a sleep (a machine with no other work)
shows little of the cold core; the ``evicted`` gaps make it cold: ``EVICT_MB`` written, then the gap slept
(``evicted``), then, right before the call, a throwaway decision (``evicted, then a decision right before``,
as the controller's ``online_warm_up``) or a read of the environment's live tables and the policy's layers
(``evicted, then its arrays read``). Median and p99 (us). No GPU needed.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np
from decider_warmth import policy_due, states
from decision_parts import no_op, python_loop
from online_decision_lock import TRACE, h200_online
from provenance import RESULTS, provenance, provenance_lines, write_results

from kdvfs.agents.learned.online import OnlinePolicy
from kdvfs.envs.env.dynamic_observation import observe_dynamic
from kdvfs.envs.env.live import LiveState
from kdvfs.runtime.controller.decision_records import quantiles

WARM_LEADS_US = (20.0, 50.0, 200.0, 500.0)
NAPS_US = (100.0, 500.0)
EVICT_MB = 64
"""Written before an ``evicted`` gap: more than the last-level cache of the machines this ran on."""


@numba.njit(cache=True)
def _arithmetic(count: int) -> float:
    value = 1.0
    for _ in range(count):
        value = value * 1.0000001 + 1e-9
    return value


@numba.njit(cache=True)
def _spin_compiled(seconds: float) -> None:
    with numba.objmode(began="float64"):
        began = time.perf_counter()
    now = began
    while now - began < seconds:
        for _ in range(1000):
            pass
        with numba.objmode(now="float64"):
            now = time.perf_counter()


def spin_python(until_s: float) -> None:
    while time.perf_counter() < until_s:
        pass


def parts(online: OnlinePolicy, walk: list[LiveState]) -> dict[str, Callable[[int], Any]]:
    """Each part's call for the ``n``-th decision."""
    env = online.env
    observe_args = []
    for state in walk:  # the compiled observation's arguments at each state, made ahead
        env.observe_live_dynamic(state)
        observe_args.append(env.compiled_observation_args())
    arrays = [np.zeros(8, dtype=np.float32 if i % 2 else np.int64) for i in range(30)]
    like_a_decision = (*arrays[:15], 0.1, 0.2, tuple(arrays[15:18]), *arrays[18:20], 0.3,
                       (tuple(arrays[20:23]), tuple(arrays[23:26])), arrays[26], 1, *arrays[27:29], 0.01, 2,
                       *walk[0], True, arrays[29], arrays[0])
    return {"decide": lambda n: online.decide(walk[n], policy_due(n)),
            "dispatch of a decision's arguments": lambda n: no_op(*like_a_decision),
            "observation and policy run": lambda n: online.warm(walk[n]),
            "observation": lambda n: env.observe_live_dynamic(walk[n]),
            "compiled observation": lambda n: observe_dynamic(*observe_args[n]),
            "python 1,000 additions": lambda n: python_loop(),
            "compiled arithmetic": lambda n: _arithmetic(20_000)}


def gaps(online: OnlinePolicy, walk: list[LiveState]) -> dict[str, Callable[[int, float], None]]:
    """What the thread does before the ``n``-th call, due at ``due_s`` (perf_counter s)."""
    def warmed(lead_s: float) -> Callable[[int, float], None]:
        def gap(n: int, due_s: float) -> None:
            time.sleep(max(0.0, due_s - lead_s - time.perf_counter()))
            online.warm(walk[max(n - 1, 0)])
            spin_python(due_s)
        return gap

    def napped(nap_s: float) -> Callable[[int, float], None]:
        def gap(n: int, due_s: float) -> None:
            while (left_s := due_s - time.perf_counter()) > 0:
                time.sleep(min(nap_s, left_s))
        return gap

    evict = np.zeros(EVICT_MB * 2**20 // 8)
    arrays = [a for a in (*online.env.live_tables().arrays(), *online.policy.weights, *online.policy.biases)
              if isinstance(a, np.ndarray)]

    def evicted(before: Callable[[int], None]) -> Callable[[int, float], None]:
        def gap(n: int, due_s: float) -> None:
            evict[:] += 1.0
            time.sleep(max(0.0, due_s - time.perf_counter()))
            before(n)
        return gap

    result: dict[str, Callable[[int, float], None]] = {
        "back to back": lambda n, due_s: None,
        "spun in python": lambda n, due_s: spin_python(due_s),
        "spun compiled": lambda n, due_s: _spin_compiled(due_s - time.perf_counter()),
        "slept": lambda n, due_s: time.sleep(max(0.0, due_s - time.perf_counter()))}
    for lead_us in WARM_LEADS_US:
        result[f"slept, then a decision {lead_us:g} us before"] = warmed(lead_us * 1e-6)
    for nap_us in NAPS_US:
        result[f"napped {nap_us:g} us at a time"] = napped(nap_us * 1e-6)
    result["evicted"] = evicted(lambda n: None)
    result["evicted, then a decision right before"] = evicted(lambda n: online.warm(walk[max(n - 1, 0)]))
    result["evicted, then its arrays read"] = evicted(lambda n: [a.sum() for a in arrays])
    return result


def measure(online: OnlinePolicy, calls: int, gap_s: float, only: str) -> list[dict[str, Any]]:
    """Each kept cell's times (see the module docstring); ``only``: comma-separated words, a cell is kept if
    ``"part | gap"`` has one (all if empty)."""
    walk = states(online, calls)
    rows = []
    for (part, call), (gap, before) in itertools.product(parts(online, walk).items(), gaps(online, walk).items()):
        if only and not any(word in f"{part} | {gap}" for word in only.split(",")):
            continue
        online.begin(0.01)
        call(0)
        times_us = []
        for n in range(calls):
            before(n, time.perf_counter() + gap_s)
            began_s = time.perf_counter()
            call(n)
            times_us.append(1e6 * (time.perf_counter() - began_s))
        rows.append({"part": part, "gap": gap, "us": quantiles(times_us)})
        print(f"{part:24s} {gap:40s} {rows[-1]['us']['median']:8.1f} {rows[-1]['us']['p99']:8.1f}", flush=True)
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--gap-ms", type=float, default=6.0)
    parser.add_argument("--only", default="", help="comma-separated words: only the cells whose 'part | gap' "
                        "has one")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the results files")
    args = parser.parse_args(argv)
    rows = measure(h200_online(), args.calls, args.gap_ms / 1e3, args.only)
    document = {"provenance": provenance("python benchmarks/decision_cold.py " + " ".join(argv)),
                "versions": {"numba": numba.__version__, "numpy": np.__version__}, "trace": TRACE,
                "calls": args.calls, "gap_ms": args.gap_ms, "rows": rows}
    write_results("decision_cold", document, markdown(document), folder=args.out)
    print(markdown(document))
    return 0


def _cell(us: dict[str, float] | None) -> str:
    return "-" if us is None else f"{us['median']:.1f} / {us['p99']:.1f}"


def markdown(document: dict[str, Any]) -> str:
    rows = document["rows"]
    part_names = list(dict.fromkeys(r["part"] for r in rows))
    cells = {(r["gap"], r["part"]): r["us"] for r in rows}
    lines = ["# What a gap between decisions costs a compiled decision", "",
             *provenance_lines(document["provenance"]), "",
             f"numba {document['versions']['numba']}, numpy {document['versions']['numpy']}; the shipped H200 "
             f"policy on `{document['trace']}`; {document['calls']} calls per cell, one per gap of "
             f"{document['gap_ms']:g} ms, at states moving through the step; median / p99 (us).", "",
             "| before the call | " + " | ".join(part_names) + " |", "| --- |" + " ---: |" * len(part_names)]
    for gap in dict.fromkeys(r["gap"] for r in rows):
        lines.append(f"| {gap} | " + " | ".join(_cell(cells.get((gap, part))) for part in part_names) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
