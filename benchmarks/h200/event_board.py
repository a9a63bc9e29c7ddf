"""The event board on a real GPU: what the timeline reads against torch's own events, what its parts cost.

    python -m benchmarks.h200.event_board run OUT.json [--steps 60] [--anchors 10] [--cpu]   # on the GPU machine
    python -m benchmarks.h200.event_board report OUT.json [--name event_board_h100]          # benchmarks/results/NAME.*

``run``, read-only (no NVML, no clock touched): (1) **agreement**: a launch-bound loop (``--steps`` steps of
``OPS_PER_STEP`` small ops, ``--anchors`` anchors and a mark a step) through this process's timeline
(``gpu_timeline.local_timeline``: recorder, native poller, board) beside torch's timing events at each step's start:
the largest difference of a step's time on the board from torch's ``elapsed_time`` (ms), the anchors' order, the
items passed; (2) **a hook's parts** on the training thread: the CPU (``time.thread_time``) per call of a timing
event's record, the current stream, the allocation count (a step's signature), the recorder's ``anchor`` and
``mark``, each the median of ``BLOCKS`` blocks of ``CALLS`` calls (marks ``CALLS // 10``); (3) **the poller's CPU**
per poll and share of a core during the loop and idle (``IDLE_S``, nothing pending). ``--cpu``: fake GPU events
(:class:`~kdvfs.runtime.testing.fake_cuda_events.FakeCudaEvents`, whose calls take the interpreter lock) and CPU
tensors, no torch event: a check of the script, not a figure.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common.provenance import host, nvidia_smi, utc_now, write_results
from benchmarks.common.run_report import device_report, number_cell, run_report_parser
from kdvfs.runtime.controller.timing.gpu_events.board import (
    ANCHORS_PASSED,
    HOOK_S,
    MARKS_PASSED,
    POLLER_CPU_S,
    POLLS,
    EventBoard,
)
from kdvfs.runtime.controller.timing.gpu_events.recorder import EventRecorder
from kdvfs.runtime.controller.timing.gpu_timeline import BoardTimeline, allocations, current_stream, local_timeline
from kdvfs.runtime.device.host_time import RealClock

OPS_PER_STEP = 200
CALLS = 200
BLOCKS = 15
IDLE_S = 2.0


def per_call_us(call: Callable[[], Any], calls: int, between: Callable[[], Any] = lambda: None) -> float:
    """The training thread's CPU per call of ``call`` (us): the median over ``BLOCKS`` blocks of ``calls`` calls,
    ``between`` run (untimed) after each block."""
    blocks = []
    for _ in range(BLOCKS):
        began_s = time.thread_time()
        for _ in range(calls):
            call()
        blocks.append((time.thread_time() - began_s) / calls * 1e6)
        between()
    return statistics.median(blocks)


def _timeline(cpu: bool) -> tuple[BoardTimeline, Callable[[], Any], Callable[[], None]]:
    """This process's timeline, a timing event maker and what moves the GPU's time before each record: torch's
    events on the GPU (nothing to move), fake events on the host's time with ``cpu``."""
    if not cpu:
        import torch

        return local_timeline(RealClock(), False), lambda: torch.cuda.Event(enable_timing=True), lambda: None
    from kdvfs.runtime.testing.fake_cuda_events import FakeCudaEvents

    fake = FakeCudaEvents()
    recorder = EventRecorder(EventBoard.local(), fake.calls(), fake.new_event, lambda: None, None)

    def tick() -> None:
        fake.gpu_s = time.perf_counter()

    return BoardTimeline(recorder.board, RealClock(), recorder), fake.new_event, tick


def agreement(timeline: BoardTimeline, steps: int, anchors: int, cpu: bool,
              tick: Callable[[], None]) -> dict[str, Any]:
    """Part 1 of the module docstring (without torch's events with ``cpu``; the items passed and the poller's CPU
    counted over this loop alone); ``tick`` before each record (:func:`_timeline`)."""
    import torch

    device = "cpu" if cpu else "cuda"
    x, w = torch.randn(256, 256, device=device), torch.randn(256, 256, device=device)
    starts = [] if cpu else [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    board, every, recorder = timeline.board, max(1, OPS_PER_STEP // anchors), timeline.recorder
    assert isinstance(recorder, EventRecorder)
    polls, cpu_s, hook_s, began_s = int(board.ints[POLLS]), float(board.floats[POLLER_CPU_S]), \
        float(board.floats[HOOK_S]), time.perf_counter()
    anchors_before, marks_before = int(board.ints[ANCHORS_PASSED]), int(board.ints[MARKS_PASSED])
    tokens = []
    for step in range(steps):
        if starts:
            starts[step].record()
        y = x
        for op in range(OPS_PER_STEP):
            y = torch.tanh(y @ w) if op % 3 == 0 else y + 1.0
            if op % every == 0:
                tick()
                recorder.anchor()
        tick()
        tokens.append(timeline.mark())
    if starts:
        starts[steps].record()
    ends = [timeline.wait(token, time.perf_counter()) for token in tokens]
    loop_s = time.perf_counter() - began_s
    errors_ms = []
    if starts:
        torch.cuda.synchronize()
        torch_ms = [starts[i].elapsed_time(starts[i + 1]) for i in range(1, steps - 1)]
        errors_ms = [abs(t - 1e3 * (e.duration_s or 0.0)) for t, e in zip(torch_ms, ends[1:steps - 1], strict=True)]
    ordered = all(all(b > a for a, b in zip(e.anchors_s, e.anchors_s[1:], strict=False))
                  and (not e.anchors_s or e.anchors_s[-1] < e.end_s) for e in ends)
    loop_polls = int(board.ints[POLLS]) - polls
    loop_cpu_s = float(board.floats[POLLER_CPU_S]) - cpu_s
    return {"steps": steps, "anchors_per_step": anchors, "step_ms": 1e3 * loop_s / steps,
            "max_duration_error_ms": max(errors_ms) if errors_ms else None, "ordered": ordered,
            "anchors_seen": sum(len(e.anchors_s) for e in ends),
            "anchors_passed": int(board.ints[ANCHORS_PASSED]) - anchors_before,
            "marks_passed": int(board.ints[MARKS_PASSED]) - marks_before,
            "hook_us_per_step": 1e6 * (float(board.floats[HOOK_S]) - hook_s) / steps,
            "poller_us_per_poll": 1e6 * loop_cpu_s / loop_polls if loop_polls else None,
            "poller_pct_of_core": 100 * loop_cpu_s / loop_s}


def hook_parts(timeline: BoardTimeline, new_event: Callable[[], Any], cpu: bool) -> dict[str, float | None]:
    """Part 2 of the module docstring (the torch-only parts None with ``cpu``)."""
    recorder = timeline.recorder
    assert isinstance(recorder, EventRecorder)
    events = [new_event() for _ in range(64)]
    turn = iter(range(1 << 62))
    stream = None if cpu else current_stream()
    parts: dict[str, float | None] = {
        "event_record_us": per_call_us(lambda: events[next(turn) % 64].record(stream), CALLS),
        "current_stream_us": None if cpu else per_call_us(current_stream, CALLS),
        "allocations_us": None if cpu else per_call_us(allocations, CALLS)}
    parts["anchor_us"] = per_call_us(recorder.anchor, CALLS, between=timeline.mark)
    parts["mark_us"] = per_call_us(timeline.mark, CALLS // 10, between=lambda: time.sleep(0.005))  # the poller
    # passes a block's marks before the next: a block is well within the ring's MARK_SLOTS
    return parts


def idle_poller(board: EventBoard) -> dict[str, float | None]:
    """Part 3's idle figures: the poller's CPU per poll and its share of a core over ``IDLE_S`` with nothing
    pending."""
    time.sleep(0.2)
    polls, cpu_s = int(board.ints[POLLS]), float(board.floats[POLLER_CPU_S])
    time.sleep(IDLE_S)
    made, spent_s = int(board.ints[POLLS]) - polls, float(board.floats[POLLER_CPU_S]) - cpu_s
    return {"idle_polls_per_s": made / IDLE_S, "idle_us_per_poll": 1e6 * spent_s / made if made else None,
            "idle_pct_of_core": 100 * spent_s / IDLE_S}


def run(out: Path, steps: int, anchors: int, cpu: bool) -> None:
    """The three parts into ``out`` (JSON)."""
    started_utc = utc_now()
    timeline, new_event, tick = _timeline(cpu)
    try:
        agreement(timeline, 3, anchors, cpu, tick)  # torch, the device, the poller's first polls made ready
        log = {**host("benchmarks.h200.event_board"),
               "started_utc": started_utc, "gpu": None if cpu else nvidia_smi(header=False),
               "agreement": agreement(timeline, steps, anchors, cpu, tick),
               "hook_parts": hook_parts(timeline, new_event, cpu),
               "poller_idle": idle_poller(timeline.board)}
    finally:
        timeline.stop()
    out.write_text(json.dumps(log, indent=1))


def report(path: Path, name: str) -> None:
    """``benchmarks/results/NAME.{json,md}`` from a run's log."""
    log = json.loads(path.read_text())
    a, parts, idle = log["agreement"], log["hook_parts"], log["poller_idle"]
    record, header = device_report("benchmarks.h200.event_board", path, name, log)
    result = {**record, "agreement": a, "hook_parts": parts, "poller_idle": idle}
    lines = [f"# The event board on {log['gpu'] or 'the CPU (fake events)'}", "", *header, "",
             "## Against torch's own events (a launch-bound loop)", "",
             f"- {a['steps']} steps of {a['step_ms']:.2f} ms, {a['anchors_per_step']} anchors each: step times within "
             f"{number_cell(a['max_duration_error_ms'], '.4f')} ms of torch's; anchors in order and before their "
             "step's end: "
             f"{a['ordered']}; passed {a['anchors_passed']} anchors and {a['marks_passed']} marks",
             f"- the recorder's CPU on the training thread: {a['hook_us_per_step']:.1f} us a step (the board's "
             "sampled figure); the poller: " f"{number_cell(a['poller_us_per_poll'], '.2f')} us a poll, "
             f"{a['poller_pct_of_core']:.2f}% of a core", "",
             "## A hook's parts (training thread's CPU per call, median of blocks)", "",
             "| event record | current stream | allocation count | recorder anchor | recorder mark |",
             "| ---: | ---: | ---: | ---: | ---: |",
             "| " + " | ".join(f"{number_cell(parts[k], '.2f')} us" for k in (
                 "event_record_us", "current_stream_us", "allocations_us", "anchor_us", "mark_us")) + " |", "",
             "## The poller idle (nothing pending)", "",
             f"- {idle['idle_polls_per_s']:.0f} polls a second, "
             f"{number_cell(idle['idle_us_per_poll'], '.2f')} us a poll, "
             f"{idle['idle_pct_of_core']:.2f}% of a core"]
    write_results(name, result, "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser, run_parser = run_report_parser(__doc__, "event_board_h100")
    run_parser.add_argument("--steps", type=int, default=60, help="steps of the launch-bound loop (>= 3)")
    run_parser.add_argument("--anchors", type=int, default=10, help="anchors a step (1-200)")
    run_parser.add_argument("--cpu", action="store_true", help="fake events, CPU tensors (a check of the script)")
    args = parser.parse_args(argv)
    if args.what == "run":
        if args.steps < 3 or not 1 <= args.anchors <= OPS_PER_STEP:
            parser.error(f"need --steps >= 3 and 1 <= --anchors <= {OPS_PER_STEP}")
        run(args.out, args.steps, args.anchors, args.cpu)
    else:
        report(args.log, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
