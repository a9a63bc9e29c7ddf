"""What a gap between decisions costs each part of a compiled online decision, and what a warm-up before it buys.

    python benchmarks/decision_cold.py [--calls 200] [--gap-ms 6] [--out DIR]
    # writes benchmarks/results/decision_cold.{json,md} (or DIR/...)

A controller decides once every few milliseconds; back to back its decision is ~4x faster than in a run
(``decision_parts``, ``decider_warmth``). Each cell here times one part after one kind of gap, ``--calls``
times, on the shipped H200 policy and the bundled GPT-3 XL step, at states moving through the step (25 a
step). The parts separate the Python interpreter's share from compiled code's and from memory:

* ``decide``: ``OnlinePolicy.decide`` with the policy run (the controller's decision, less its request);
* ``compiled only``: the observation kernel and the forward pass called with their arguments ready;
* ``python 1,000 additions``: interpreter work touching no data;
* ``sweep of the decision's arrays``: a compiled read of every array the decision reads (~320 KB);
* ``compiled arithmetic``: a compiled loop of 20,000 dependent float operations touching no memory.

The gaps: ``back to back``; ``spun in python`` or ``spun compiled`` for the whole gap (never sleeping, no
system calls); ``slept`` the whole gap; ``slept, then a decision W us before`` (a throwaway decision at the
previous state, ``OnlinePolicy.warm``, then spun in Python until due); ``slept, then the sweep W us before``.
Median and p99 (us). No GPU needed.
"""

from __future__ import annotations

import argparse
import itertools
import mmap
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np
from decider_warmth import policy_due, states
from online_decision_lock import TRACE, h200_online
from provenance import RESULTS, provenance, provenance_lines, write_results

from kdvfs.agents.learned.forward import argmax_parts, dense, first_layer
from kdvfs.agents.learned.frozen import ACTIVATIONS, FrozenPolicy
from kdvfs.agents.learned.online import OnlinePolicy
from kdvfs.envs.env.dynamic_observation import observe_dynamic
from kdvfs.envs.env.live import LiveState
from kdvfs.runtime.controller.online import quantiles

WARM_LEADS_US = (20.0, 50.0, 200.0, 500.0)
NAPS_US = (100.0, 500.0)
SWEEP_LEADS_US = (100.0, 300.0)


@numba.njit(cache=True)
def sweep(arrays: tuple[np.ndarray, ...]) -> int:
    """Read one byte of each 64-byte line of each array, in one compiled call."""
    total = 0
    for data in numba.literal_unroll(arrays):
        for index in range(0, data.shape[0], 64):
            total += data[index]
    return total


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


def python_loop() -> int:
    total = 0
    for n in range(1000):
        total += n
    return total


def decision_arrays(online: OnlinePolicy) -> tuple[np.ndarray, ...]:
    """Every array a decision reads, as flat byte views of the same memory."""
    arrays = [a for a in online.env.compiled_observation_args() if isinstance(a, np.ndarray)]
    arrays += [layer for triple in online.policy._layers for layer in triple]
    arrays.append(online._first_products)
    return tuple(a.reshape(-1).view(np.uint8) for a in arrays)


def on_huge_page(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Copies of ``arrays`` packed from a 2 MiB boundary of a 4 MiB anonymous mapping advised to be backed by
    transparent huge pages (``MADV_HUGEPAGE``), 64-byte aligned each."""
    mapping = mmap.mmap(-1, 4 << 20)
    mapping.madvise(mmap.MADV_HUGEPAGE)
    arena = np.frombuffer(mapping, dtype=np.uint8)
    offset = -arena.ctypes.data % (2 << 20)
    copies = []
    for array in arrays:
        view = arena[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
        view[...] = array
        copies.append(view)
        offset += -(-array.nbytes // 64) * 64
    return copies


def thp_setting() -> str:
    """The kernel's transparent huge page mode (``[madvise]`` marks the one in use), or ``unknown``."""
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return path.read_text().strip() if path.exists() else "unknown"


def huge_pages_kib() -> int:
    """This process's anonymous memory on transparent huge pages (KiB; /proc/self/smaps_rollup)."""
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def forward_on(policy: FrozenPolicy, layers: list[np.ndarray], rest_size: int) -> Callable[[np.ndarray, np.ndarray],
                                                                                                 np.ndarray]:
    """``policy.act_from`` with its layers' arrays (w, b, out per layer, then the first layer's normalisation)
    replaced by ``layers``."""
    (weight, bias, x), (hidden_weight, hidden_bias, out), (last_weight, last_bias, logits) = (
        layers[0:3], layers[3:6], layers[6:9])
    mean, inverse_std, bounds = layers[9], layers[10], layers[11]
    start = len(weight) - rest_size
    weight, mean, inverse_std = weight[start:], mean[start:], inverse_std[start:]
    activation = ACTIVATIONS[policy.activation]

    def act_from(first_product: np.ndarray, rest: np.ndarray) -> np.ndarray:
        h = first_layer(weight, rest, mean, inverse_std, policy.obs_clip, first_product, bias, x, activation)
        return argmax_parts(last_weight, dense(hidden_weight, h, hidden_bias, out, activation), last_bias, logits,
                            bounds)
    return act_from


def parts(online: OnlinePolicy, walk: list[LiveState]) -> dict[str, Callable[[int], Any]]:
    """Each part's call for the ``n``-th decision."""
    env, policy = online.env, online.policy
    product = np.zeros(len(policy.biases[0]), dtype=np.float32)
    swept = decision_arrays(online)
    layers = [a for triple in policy._layers for a in triple]
    layers += [policy._mean32, policy._inverse_std32, policy._bounds]
    huge = on_huge_page(layers)
    rest_size = len(rests_of := env.observe_live_dynamic(walk[0]))
    del rests_of
    plain_forward, huge_forward = forward_on(policy, layers, rest_size), forward_on(policy, huge, rest_size)

    def compiled_only(n: int) -> Any:
        observe_dynamic(*observation_args[n])
        return policy.act_from(product, rests[n])

    observation_args, rests = [], []
    for state in walk:
        rests.append(env.observe_live_dynamic(state).copy())
        observation_args.append(env.compiled_observation_args())
    return {"decide": lambda n: online.decide(walk[n], policy_due(n)),
            "compiled only": compiled_only,
            "forward pass": lambda n: plain_forward(product, rests[n]),
            "forward pass, arrays on a huge page": lambda n: huge_forward(product, rests[n]),
            "sweep of the forward's arrays": lambda n: sweep(tuple(a.reshape(-1).view(np.uint8) for a in layers)),
            "sweep of them on a huge page": lambda n: sweep(tuple(a.reshape(-1).view(np.uint8) for a in huge)),
            "python 1,000 additions": lambda n: python_loop(),
            "sweep of the decision's arrays": lambda n: sweep(swept),
            "compiled arithmetic": lambda n: _arithmetic(20_000)}


def gaps(online: OnlinePolicy, walk: list[LiveState], swept: Any,
         forward: Callable[[], Any]) -> dict[str, Callable[[int, float], None]]:
    """What the thread does before the ``n``-th call, due at ``due_s`` (perf_counter s)."""
    def warmed(lead_s: float, warm: Callable[[int], Any]) -> Callable[[int, float], None]:
        def gap(n: int, due_s: float) -> None:
            time.sleep(max(0.0, due_s - lead_s - time.perf_counter()))
            warm(n)
            spin_python(due_s)
        return gap

    result: dict[str, Callable[[int, float], None]] = {
        "back to back": lambda n, due_s: None,
        "spun in python": lambda n, due_s: spin_python(due_s),
        "spun compiled": lambda n, due_s: _spin_compiled(due_s - time.perf_counter()),
        "slept": lambda n, due_s: time.sleep(max(0.0, due_s - time.perf_counter()))}
    for lead_us in WARM_LEADS_US:
        result[f"slept, then a decision {lead_us:g} us before"] = warmed(
            lead_us * 1e-6, lambda n: online.warm(walk[max(n - 1, 0)]))
    result["slept, then the forward pass 50 us before"] = warmed(50e-6, lambda n: forward())
    result["slept, then the sweep 200 us before"] = warmed(200e-6, lambda n: sweep(swept))
    for nap_us in NAPS_US:
        result[f"napped {nap_us:g} us at a time"] = napped(nap_us * 1e-6)
    for lead_us in SWEEP_LEADS_US:
        result[f"slept, then swept over and over for {lead_us:g} us"] = swept_until(lead_us * 1e-6, swept)
    return result


def napped(nap_s: float) -> Callable[[int, float], None]:
    def gap(n: int, due_s: float) -> None:
        while (left_s := due_s - time.perf_counter()) > 0:
            time.sleep(min(nap_s, left_s))
    return gap


def swept_until(lead_s: float, swept: tuple[np.ndarray, ...]) -> Callable[[int, float], None]:
    def gap(n: int, due_s: float) -> None:
        time.sleep(max(0.0, due_s - lead_s - time.perf_counter()))
        while time.perf_counter() < due_s:
            sweep(swept)
    return gap


def measure(online: OnlinePolicy, calls: int, gap_s: float, only: str) -> list[dict[str, Any]]:
    walk = states(online, calls)
    online.begin(0.01)
    swept = decision_arrays(online)
    rest, product = online.env.observe_live_dynamic(walk[0]).copy(), np.zeros(len(online.policy.biases[0]), np.float32)
    forward = lambda: online.policy.act_from(product, rest)  # noqa: E731
    rows = []
    for (part, call), (gap, before) in itertools.product(parts(online, walk).items(),
                                                         gaps(online, walk, swept, forward).items()):
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
        print(f"{part:32s} {gap:40s} {rows[-1]['us']['median']:8.1f} {rows[-1]['us']['p99']:8.1f}", flush=True)
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--gap-ms", type=float, default=6.0)
    parser.add_argument("--only", default="", help="comma-separated words: only the cells whose 'part | gap' "
                        "has one")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the results files")
    args = parser.parse_args(argv)
    online = h200_online()
    rows = measure(online, args.calls, args.gap_ms / 1e3, args.only)
    document = {"provenance": provenance("python benchmarks/decision_cold.py " + " ".join(argv)),
                "versions": {"numba": numba.__version__, "numpy": np.__version__}, "trace": TRACE,
                "transparent_hugepage": thp_setting(), "calls": args.calls, "gap_ms": args.gap_ms, "rows": rows}
    document["huge_pages_kib"] = huge_pages_kib()
    write_results("decision_cold", document, markdown(document), folder=args.out)
    print(markdown(document))
    return 0


def _cell(us: dict[str, float] | None) -> str:
    return "-" if us is None else f"{us['median']:.1f} / {us['p99']:.1f}"


def markdown(document: dict[str, Any]) -> str:
    rows = document["rows"]
    part_names = list(dict.fromkeys(r["part"] for r in rows))
    cells = {(r["gap"], r["part"]): r["us"] for r in rows}
    lines = ["# What a gap between decisions costs a compiled decision's parts", "",
             *provenance_lines(document["provenance"]), "",
             f"numba {document['versions']['numba']}, numpy {document['versions']['numpy']}; the shipped H200 "
             f"policy on `{document['trace']}`; {document['calls']} calls per cell, one per gap of "
             f"{document['gap_ms']:g} ms, at states moving through the step; median / p99 (us). Transparent huge "
             f"pages: `{document['transparent_hugepage']}`; the process had {document['huge_pages_kib']} KiB on "
             "them at the end.", "",
             "| before the call | " + " | ".join(part_names) + " |", "| --- |" + " ---: |" * len(part_names)]
    for gap in dict.fromkeys(r["gap"] for r in rows):
        lines.append(f"| {gap} | " + " | ".join(
            _cell(cells.get((gap, part))) for part in part_names) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
