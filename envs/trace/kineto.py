"""Import PyTorch profiler (Kineto) chrome traces into kdvfs :class:`~kdvfs.envs.trace.trace.Trace` objects.

What is kept: every GPU kernel, memset and memcpy event of one device, in GPU start order, with the
framework op that launched it (through the ``External id`` link), that op's input shapes, and the
``Optimizer.step`` annotations. The recording is split into training steps:

1. with optimizer annotations, a step ends with the last GPU activity launched inside an
   ``Optimizer.step#...`` (or the ``zero_grad`` right after it); a leading partial step is dropped;
2. without them, the activity-name sequence must repeat exactly: its smallest period (prefix function)
   is the step; it starts at the first activity when the recording holds whole periods, else after the
   longest idle gap.

Phases: forward until the first backward activity (launched from the autograd thread, or with a
backward-looking name when no op data exists), backward until the optimizer, optimizer for activities
launched inside ``Optimizer.step``, other afterwards (e.g. ``zero_grad``).
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdvfs.envs.common.errors import StepDetectionError, TraceFormatError
from kdvfs.envs.common.files import read_input
from kdvfs.envs.trace.classify import classify
from kdvfs.envs.trace.trace import Kernel, Kind, OpInfo, Phase, Trace, TraceMeta

_KIND_BY_CAT = {"kernel": Kind.KERNEL, "gpu_memset": Kind.MEMSET, "gpu_memcpy": Kind.MEMCPY}
_BACKWARD_NAME = re.compile(r"backward|bprop|_grad|dgrad|wgrad|grad_input|grad_weight", re.IGNORECASE)
_OPTIMIZER_NAME = re.compile(r"adam|multi_tensor_apply|fused_sgd", re.IGNORECASE)
_US = 1e-6


@dataclass(frozen=True)
class _Activity:
    """One GPU event with what it was launched from."""

    name: str
    kind: Kind
    start_us: float
    dur_us: float
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    bytes: float | None
    op: OpInfo | None
    launch_tid: int | None
    launch_us: float | None


@dataclass(frozen=True)
class _Recording:
    activities: list[_Activity]
    optimizer_spans: list[tuple[float, float]]
    main_tid: int | None
    gpu_name: str


def _load_events(path: Path) -> dict[str, Any]:
    text = read_input(path, TraceFormatError)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise TraceFormatError(f"{path}: not a readable JSON profiler trace ({error}); the file is corrupt or "
                               "truncated: re-export it with torch.profiler's export_chrome_trace") from None
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        raise TraceFormatError(f"{path}: no 'traceEvents' list; this is not a PyTorch profiler chrome trace "
                               "(export one with prof.export_chrome_trace('trace.json'))")
    return document


def _dim3(value: Any) -> tuple[int, int, int]:
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) for v in value):
        return (value[0], value[1], value[2])
    return (0, 0, 0)


def _shape(dims: Any) -> tuple[int, ...]:
    """A tensor's dims; a tensor list is summarised as one dim holding its total element count."""
    if not isinstance(dims, list):
        return ()
    if all(isinstance(x, int) for x in dims):
        return tuple(dims)
    total = 0
    for inner in dims:
        count = 1
        for x in _shape(inner):
            count *= x
        total += count
    return (total,)


def _op_info(event: dict[str, Any]) -> OpInfo:
    args = event.get("args") or {}
    dims = tuple(_shape(d) for d in args.get("Input Dims") or [])
    return OpInfo(str(event.get("name", "")), dims, tuple(str(t) for t in args.get("Input type") or []))


def _pick_device(gpu_events: list[dict[str, Any]], path: Path) -> int | None:
    devices = sorted({(e.get("args") or {}).get("device") for e in gpu_events}, key=str)
    if len(devices) > 1:
        raise TraceFormatError(f"{path}: GPU events from several devices {devices}; kdvfs traces one GPU: "
                               "record one rank per file (e.g. profile on rank 0 only)")
    return devices[0] if devices else None


def _parse_recording(path: Path) -> _Recording:
    document = _load_events(path)
    events = [e for e in document["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
    gpu_events = [e for e in events if e.get("cat") in _KIND_BY_CAT]
    if not gpu_events:
        raise TraceFormatError(f"{path}: no GPU kernel, memset or memcpy events; record with "
                               "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] on a GPU")
    _pick_device(gpu_events, path)
    ops = {(e.get("args") or {}).get("External id"): e for e in events if e.get("cat") == "cpu_op"}
    runtime = {(e.get("args") or {}).get("correlation"): e for e in events if e.get("cat") == "cuda_runtime"}
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
                   if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("Optimizer.step#"))
    main_tids = {e.get("tid") for e in events
                 if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("Optimizer.")}
    activities = []
    for event in sorted(gpu_events, key=lambda e: float(e.get("ts", 0.0))):
        activities.append(_activity(event, ops, runtime, path))
    if main_tids:
        main_tid = next(iter(main_tids))
    else:
        main_tid = next((a.launch_tid for a in activities if a.launch_tid is not None), None)
    devices = document.get("deviceProperties") or (document.get("meta") or {}).get("deviceProperties") or []
    gpu_name = str(devices[0].get("name", "unknown")) if devices and isinstance(devices[0], dict) else "unknown"
    return _Recording(activities, spans, main_tid, gpu_name)


def _activity(event: dict[str, Any], ops: dict[Any, Any], runtime: dict[Any, Any], path: Path) -> _Activity:
    args = event.get("args") or {}
    try:
        start_us, dur_us = float(event["ts"]), float(event["dur"])
    except (KeyError, TypeError, ValueError):
        raise TraceFormatError(f"{path}: GPU event {str(event.get('name'))[:60]!r} lacks a numeric 'ts'/'dur'; "
                               "the trace is corrupt") from None
    op_event = ops.get(args.get("External id"))
    launch = op_event or runtime.get(args.get("correlation"))
    kind = _KIND_BY_CAT[event["cat"]]
    size = args.get("bytes")
    moved = None if size is None else float(size) * (2.0 if kind is Kind.MEMCPY and "DtoD" in event["name"] else 1.0)
    return _Activity(
        name=str(event.get("name", "")), kind=kind, start_us=start_us, dur_us=max(dur_us, 1e-3),
        grid=_dim3(args.get("grid")), block=_dim3(args.get("block")), bytes=moved,
        op=_op_info(op_event) if op_event else None,
        launch_tid=launch.get("tid") if launch else None,
        launch_us=float(launch["ts"]) if launch else None,
    )


def _in_spans(time_us: float | None, spans: list[tuple[float, float]]) -> bool:
    return time_us is not None and any(lo <= time_us <= hi for lo, hi in spans)


def _steps_from_annotations(recording: _Recording) -> list[range]:
    """Index ranges of complete steps: each ends with the last activity launched in an optimizer span."""
    ends = []
    for lo, hi in recording.optimizer_spans:
        inside = [i for i, a in enumerate(recording.activities) if a.launch_us is not None and lo <= a.launch_us <= hi]
        if inside:
            ends.append(inside[-1])
    starts = [0] + [end + 1 for end in ends[:-1]]
    steps = [range(s, e + 1) for s, e in zip(starts, ends, strict=True)]
    if len(steps) >= 2 and len(steps[0]) != len(steps[1]):
        steps = steps[1:]
    return steps


def _smallest_period(keys: list[str]) -> int:
    """Smallest p such that keys[i] == keys[i + p] for all valid i (Knuth-Morris-Pratt prefix function)."""
    prefix = [0] * len(keys)
    for i in range(1, len(keys)):
        j = prefix[i - 1]
        while j and keys[i] != keys[j]:
            j = prefix[j - 1]
        prefix[i] = j + (keys[i] == keys[j])
    return len(keys) - prefix[-1]


def _steps_from_repetition(recording: _Recording, path: Path) -> list[range]:
    activities = recording.activities
    period = _smallest_period([a.name for a in activities])
    if 2 * period > len(activities):
        raise StepDetectionError(
            f"{path}: no optimizer annotations and the kernel sequence does not repeat; record at least two "
            "whole training steps, or keep torch's Optimizer.step annotations in the profile")
    if len(activities) % period == 0:
        offset = 0
    else:
        gaps = [max(0.0, b.start_us - (a.start_us + a.dur_us)) for a, b in itertools.pairwise(activities)]
        offset = (1 + max(range(len(gaps)), key=gaps.__getitem__)) % period
    return [range(s, s + period) for s in range(offset, len(activities) - period + 1, period)]


def _phases(recording: _Recording, step: range) -> list[Phase]:
    acts = [recording.activities[i] for i in step]
    in_opt = [_in_spans(a.launch_us, recording.optimizer_spans)
              or (not recording.optimizer_spans and bool(_OPTIMIZER_NAME.search(a.name))) for a in acts]
    backward = [
        (a.launch_tid is not None and recording.main_tid is not None and a.launch_tid != recording.main_tid)
        or bool(_BACKWARD_NAME.search(a.name) or (a.op and _BACKWARD_NAME.search(a.op.name)))
        for a in acts
    ]
    first_bwd = next((i for i, b in enumerate(backward) if b), len(acts))
    first_opt = next((i for i, o in enumerate(in_opt) if o), len(acts))
    phases = []
    for i in range(len(acts)):
        if in_opt[i]:
            phases.append(Phase.OPTIMIZER)
        elif i < min(first_bwd, first_opt):
            phases.append(Phase.FORWARD)
        elif i < first_opt:
            phases.append(Phase.BACKWARD)
        else:
            phases.append(Phase.OTHER)
    return phases


def split_steps(path: Path) -> tuple[_Recording, list[range]]:
    """Parse a Kineto trace and return it with the index ranges of its complete training steps."""
    recording = _parse_recording(Path(path))
    steps = _steps_from_annotations(recording) if recording.optimizer_spans else []
    if not steps:
        steps = _steps_from_repetition(recording, Path(path))
    return recording, steps


def _kernel(activity: _Activity, phase: Phase, gap_us: float) -> Kernel:
    category = classify(activity.name, activity.op.name if activity.op else None, activity.kind,
                        in_optimizer=phase is Phase.OPTIMIZER and activity.kind is Kind.KERNEL)
    return Kernel(
        name=activity.name, kind=activity.kind, category=category, phase=phase,
        duration_s=activity.dur_us * _US, gap_before_s=gap_us * _US, grid=activity.grid, block=activity.block,
        op=activity.op, dram_bytes=activity.bytes,
    )


def import_kineto(path: Path, step: int = -1, workload: str | None = None,
                  measurements: dict[str, float] | None = None, ref_mem_mhz: float | None = None,
                  observed_core_mhz: float | None = None) -> Trace:
    """Import one training step of a Kineto chrome trace.

    Args:
        path: ``.json`` or ``.json.gz`` exported by ``torch.profiler``.
        step: which complete step to keep (Python indexing; default the last, the warmest).
        workload: label stored in the metadata (default: the file name without suffixes).
        measurements: whole-step measurements to store (e.g. joules per step).
        ref_mem_mhz: memory clock during the recording (MHz), when known.
        observed_core_mhz: median SM clock seen during the recording (MHz), when known.
    """
    path = Path(path)
    recording, steps = split_steps(path)
    if not steps:
        raise StepDetectionError(f"{path}: no complete training step found; record at least one whole step "
                                 "including its optimizer.step()")
    try:
        chosen = steps[step]
    except IndexError:
        raise StepDetectionError(f"{path}: step {step} does not exist; the recording holds {len(steps)} complete "
                                 f"steps (use 0..{len(steps) - 1} or -1 for the last)") from None
    acts = recording.activities
    kernels = []
    for i, phase in zip(chosen, _phases(recording, chosen), strict=True):
        previous_end = acts[i - 1].start_us + acts[i - 1].dur_us if i > 0 else acts[i].start_us
        kernels.append(_kernel(acts[i], phase, max(0.0, acts[i].start_us - previous_end)))
    label = workload or path.name.split(".")[0]
    meta = TraceMeta(gpu=recording.gpu_name, workload=label, source=f"kineto:{path.name}",
                     ref_mem_mhz=ref_mem_mhz, ref_core_mhz=None, observed_core_mhz=observed_core_mhz,
                     step_index=steps.index(chosen), measurements=measurements or {})
    return Trace(meta=meta, kernels=tuple(kernels))

