"""What the controller's pieces cost the training process, per call, on the GPU machine (read-only).

    python benchmarks/controller_costs.py [--calls 2000] [--out DIR]
    # writes benchmarks/results/controller_costs.{json,md} (or DIR/...)

Per call, on the thread that makes it (CPU time; wall time beside it): the calls the training thread makes
for the controller (``CudaStepTimeline.mark`` at each step end, of which the allocation count; ``anchor``
at each anchor hook, of which ``torch.cuda.current_stream`` and ``Event.record``, and the same with the
stream objects kept, ``gpu_timeline.current_stream``; a tensor hook's registration), and what a few numpy
calls and a whole online decision cost after the thread slept (the controller's thread sleeps between
decision points; a core left idle runs the next Python slower) or spun instead. Then a GPT-2 small training
step (``examples/gpt.py``, batch 8) with and without the anchor hooks: the training thread's CPU time per
step. Nothing here touches a clock; NVML is not used.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from provenance import RESULTS, provenance, provenance_lines, write_results

TRAIN_STEPS = 30


def sleep_s(duration_s: float) -> Callable[[], None]:
    return lambda: time.sleep(duration_s)


def spin_s(duration_s: float) -> Callable[[], None]:
    """Busy-wait ``duration_s`` in Python (the thread never sleeps)."""
    def spin() -> None:
        end_s = time.perf_counter() + duration_s
        while time.perf_counter() < end_s:
            pass

    return spin


BEFORE: tuple[tuple[str, Callable[[], None]], ...] = (
    ("nothing (back to back)", lambda: None), ("slept 20 us", sleep_s(20e-6)), ("slept 0.5 ms", sleep_s(0.5e-3)),
    ("slept 5 ms", sleep_s(5e-3)), ("spun 5 ms (never slept)", spin_s(5e-3)))
"""What the thread did before each call of the idle rows."""


def per_call(call: Callable[[], Any], calls: int, before: Callable[[], None] = lambda: None) -> dict[str, float]:
    """Median and p99 of ``call``'s CPU and wall time (us) over ``calls`` calls, each after ``before()``."""
    cpu_us, wall_us = np.empty(calls), np.empty(calls)
    for n in range(calls):
        before()
        began, began_cpu = time.perf_counter(), time.thread_time()
        call()
        wall_us[n], cpu_us[n] = 1e6 * (time.perf_counter() - began), 1e6 * (time.thread_time() - began_cpu)
    return {"cpu_median_us": float(np.median(cpu_us)), "cpu_p99_us": float(np.percentile(cpu_us, 99)),
            "wall_median_us": float(np.median(wall_us)), "wall_p99_us": float(np.percentile(wall_us, 99))}


def hook_calls(calls: int) -> list[dict[str, Any]]:
    """The training thread's calls for the controller, each timed alone."""
    import torch

    from kdvfs.runtime.controller.gpu_timeline import CudaStepTimeline, _allocations, current_stream
    from kdvfs.runtime.device.host_time import RealClock

    timeline = CudaStepTimeline(RealClock())
    event = torch.cuda.Event(enable_timing=True, blocking=True)
    leaf = torch.zeros(4, device="cuda", requires_grad=True)

    def anchor_step() -> None:  # as many anchors as a step has, then its mark and its end, once the GPU passed it
        for _ in range(25):
            timeline.anchor()
        token = timeline.mark()
        token[0].synchronize()  # so that wait() reads the end, without a poll's sleep (gpu_timeline.wait_for)
        timeline.wait(token)

    rows: list[tuple[str, Callable[[], Any]]] = [
        ("torch.cuda.current_stream()", torch.cuda.current_stream), ("Event.record()", event.record),
        ("kdvfs current_stream() (its stream objects kept)", current_stream),
        ("Event.record(current_stream())", lambda: event.record(current_stream())),
        ("allocation count (memory_stats_as_nested_dict)", _allocations),
        ("tensor.register_hook", lambda: (leaf * 1).register_hook(lambda g: None)),
        ("tensor.grad_fn.register_prehook (the gradient anchors' hook)",
         lambda: (leaf * 1).grad_fn.register_prehook(lambda g: None))]
    result = [{"call": name, **per_call(call, calls)} for name, call in rows]
    timeline.wait(timeline.mark())
    step = per_call(anchor_step, max(1, calls // 25))
    result.append({"call": "25 x anchor() + mark() + wait() (a passed step end)", **step})
    return result


def idle_calls(calls: int) -> list[dict[str, Any]]:
    """A numpy call, a small MLP layer and a whole online decision (the shipped H200 policy on the bundled
    GPT-3 XL step, as ``online_decision_lock.py`` makes them) after each of ``BEFORE``."""
    from online_decision_lock import TRACE

    from kdvfs.agents.common.problem import Problem
    from kdvfs.agents.learned.frozen import FrozenPolicy
    from kdvfs.agents.learned.online import OnlinePolicy
    from kdvfs.agents.learned.policy_planner import shipped_policy_path
    from kdvfs.envs.env.live import LiveState
    from kdvfs.envs.gpu.profiles import load_profile
    from kdvfs.envs.trace.bundled import open_trace

    profile = load_profile("h200")
    online = OnlinePolicy(FrozenPolicy.load(shipped_policy_path("h200"), profile),
                          Problem.build(open_trace(TRACE), profile, 0.01))
    online.begin(0.01)
    kernel = len(online.cumulative_s) // 2
    auto_s = float(online.cumulative_s[kernel, 0])
    state = LiveState(kernel, 0, -1, 0.0, auto_s * 1.005, auto_s)
    x, weight = np.zeros(128, dtype=np.float32), np.zeros((128, 193), dtype=np.float32)
    rest = np.zeros(193, dtype=np.float32)
    due_s = itertools.count(1)  # a second apart: past the standing order's hold, so that the policy runs each time
    calls_of = (("np.add (128,)", lambda: np.add(x, x, out=x)),
                ("np.matmul (128, 193) @ (193,)", lambda: np.matmul(weight, rest, out=x)),
                ("OnlinePolicy.decide (policy run)", lambda: online.decide(state, float(next(due_s)))))
    return [{"call": name, "before": label, **per_call(call, calls, before)}
            for label, before in BEFORE for name, call in calls_of]


def training_cpu(hooks: bool) -> dict[str, float]:
    """GPT-2 small (batch 8, bf16) training steps: the training thread's CPU and wall time per step (ms)."""
    import torch

    from examples.gpt import GPT, SIZES
    from kdvfs.runtime.controller.anchors import AnchorHooks
    from kdvfs.runtime.controller.gpu_timeline import CudaStepTimeline
    from kdvfs.runtime.device.host_time import RealClock

    size = SIZES["gpt2s"]
    model = GPT(size).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens, targets = torch.randint(size.vocab, (2, 8, size.seq), device="cuda")
    timeline = CudaStepTimeline(RealClock())
    installed = AnchorHooks(timeline.anchor) if hooks else None
    if installed is not None:
        installed.install()
    cpu_ms, wall_ms = [], []
    for n in range(TRAIN_STEPS + 5):
        torch.cuda.synchronize()
        began, began_cpu = time.perf_counter(), time.thread_time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(tokens, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        token = timeline.mark()
        cpu = time.thread_time() - began_cpu
        token[0].synchronize()  # the step's end, without a poll's sleep in its wall time
        timeline.wait(token)
        if n >= 5:
            cpu_ms.append(1e3 * cpu)
            wall_ms.append(1e3 * (time.perf_counter() - began))
    if installed is not None:
        installed.remove()
    return {"hooks": hooks, "blocks": installed.blocks if installed else 0,
            "cpu_ms_per_step": float(np.median(cpu_ms)), "wall_ms_per_step": float(np.median(wall_ms))}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the results files")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    document: dict[str, Any] = {"provenance": provenance("python benchmarks/controller_costs.py " + " ".join(argv)),
                                "idle": idle_calls(args.calls)}
    if torch.cuda.is_available():
        document["gpu"] = torch.cuda.get_device_name()
        document["hooks"] = hook_calls(args.calls)
        document["training"] = [training_cpu(False), training_cpu(True)]
    write_results("controller_costs", document, markdown(document), folder=args.out)
    return 0


def _row(r: dict[str, Any], first: str) -> str:
    return (f"| {first} | {r['cpu_median_us']:.1f} | {r['cpu_p99_us']:.1f} | {r['wall_median_us']:.1f} | "
            f"{r['wall_p99_us']:.1f} |")


def markdown(document: dict[str, Any]) -> str:
    head = ("| {} | CPU median (us) | CPU p99 (us) | wall median (us) | wall p99 (us) |\n"
            "| --- | ---: | ---: | ---: | ---: |")
    lines = ["# What the controller's pieces cost the training process, per call", "",
             *provenance_lines(document["provenance"]), "", "## After the thread slept or spun", "",
             head.format("call, after"), *(_row(r, f"{r['call']}, {r['before']}") for r in document["idle"])]
    if "hooks" in document:
        lines += ["", f"## On the training thread ({document['gpu']})", "", head.format("call"),
                  *(_row(r, r["call"]) for r in document["hooks"]), "",
                  f"GPT-2 small, batch 8, bf16, median of {TRAIN_STEPS} steps:", "",
                  "| anchor hooks | blocks | training thread CPU (ms/step) | step wall time (ms) |",
                  "| --- | ---: | ---: | ---: |",
                  *(f"| {'on' if t['hooks'] else 'off'} | {t['blocks']} | {t['cpu_ms_per_step']:.2f} | "
                    f"{t['wall_ms_per_step']:.2f} |" for t in document["training"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
