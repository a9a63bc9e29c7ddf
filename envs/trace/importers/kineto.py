"""The ``kineto`` importer: PyTorch profiler chrome traces (``.json`` or ``.json.gz``) as a :class:`Recording`.

What is kept: every GPU kernel, memset and memcpy event of one device, in GPU start order, with the
framework op that launched it (through the ``External id`` link) and that op's input shapes, the launching
thread and time (of the op, else of the CUDA runtime call with the same ``correlation``), and the
``Optimizer.step#...`` annotations as optimizer spans. Step splitting and phase labelling are
:mod:`kdvfs.envs.trace.importing`'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kdvfs.common.errors import TraceFormatError
from kdvfs.common.files import read_input
from kdvfs.envs.trace.importing import Activity, Recording, register_importer
from kdvfs.envs.trace.trace import Kind, OpInfo

_KIND_BY_CAT = {"kernel": Kind.KERNEL, "gpu_memset": Kind.MEMSET, "gpu_memcpy": Kind.MEMCPY}


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


@register_importer("kineto")
def read_kineto(path: Path) -> Recording:
    """Read a Kineto chrome trace's GPU activities and optimizer spans."""
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
    return Recording(path, activities, spans, main_tid, gpu_name)


def _activity(event: dict[str, Any], ops: dict[Any, Any], runtime: dict[Any, Any], path: Path) -> Activity:
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
    return Activity(
        name=str(event.get("name", "")), kind=kind, start_us=start_us, dur_us=max(dur_us, 1e-3),
        grid=_dim3(args.get("grid")), block=_dim3(args.get("block")), bytes=moved,
        op=_op_info(op_event) if op_event else None,
        launch_tid=launch.get("tid") if launch else None,
        launch_us=float(launch["ts"]) if launch else None,
    )
