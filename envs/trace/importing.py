"""What every profiler-recording importer shares: the activity record, step splitting, phase labelling, the registry.

An importer is one module in :mod:`kdvfs.envs.trace.importers` that reads its file format into a
:class:`Recording` and registers that reader under its format name with :func:`register_importer`;
:func:`import_trace` does the rest for every format. The recording is split into training steps:

1. with optimizer spans, a step ends with the last GPU activity launched inside one (an
   ``Optimizer.step#...`` annotation, or the ``zero_grad`` right after it); a leading partial step is dropped;
2. without them, the activity-name sequence must repeat exactly: its smallest period (prefix function)
   is the step; it starts at the first activity when the recording holds whole periods, else after the
   longest idle gap.

Phases: forward until the first backward activity (launched from another thread than the main one, or with
a backward-looking name when no op data exists), backward until the optimizer, optimizer for activities
launched inside an optimizer span, other afterwards (e.g. ``zero_grad``).
"""

from __future__ import annotations

import importlib
import itertools
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kdvfs.common.errors import StepDetectionError, TraceFormatError
from kdvfs.envs.trace import importers
from kdvfs.envs.trace.classify import classify
from kdvfs.envs.trace.trace import Kernel, Kind, OpInfo, Phase, Trace, TraceMeta

DEFAULT_FORMAT = "kineto"
_BACKWARD_NAME = re.compile(r"backward|bprop|_grad|dgrad|wgrad|grad_input|grad_weight", re.IGNORECASE)
_OPTIMIZER_NAME = re.compile(r"adam|multi_tensor_apply|fused_sgd", re.IGNORECASE)
_US = 1e-6


@dataclass(frozen=True)
class Activity:
    """One GPU event (kernel, memset, memcpy) with what it was launched from.

    Attributes:
        start_us, dur_us: GPU start time and duration (microseconds, any common origin).
        grid, block: launch configuration, ``(0, 0, 0)`` when unknown.
        bytes: bytes moved (memsets, memcpys), None when unknown.
        op: the framework op that launched it, with its input shapes, None when unknown.
        launch_tid, launch_us: thread and time (microseconds) of the launch, None when unknown.
    """

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
class Recording:
    """What an importer reads from one file: GPU activities in start order and the step markers.

    Attributes:
        path: the file read (named in error messages).
        optimizer_spans: (start, end) of every optimizer step on the launching thread (microseconds).
        main_tid: the thread that runs the forward pass; None when unknown.
        gpu_name: the device's name, ``"unknown"`` when the file does not say.
    """

    path: Path
    activities: list[Activity]
    optimizer_spans: list[tuple[float, float]]
    main_tid: int | None
    gpu_name: str


Reader = Callable[[Path], Recording]
_READERS: dict[str, Reader] = {}


def register_importer(format_name: str) -> Callable[[Reader], Reader]:
    """Decorator registering a reader of ``format_name`` files (``kdvfs trace import --format``)."""

    def register(reader: Reader) -> Reader:
        _READERS[format_name] = reader
        return reader

    return register


def importer_formats() -> list[str]:
    """The registered format names; every module in :mod:`kdvfs.envs.trace.importers` registers one."""
    for module in pkgutil.iter_modules(importers.__path__):
        importlib.import_module(f"{importers.__name__}.{module.name}")
    return sorted(_READERS)


def read_recording(path: Path, format_name: str = DEFAULT_FORMAT) -> Recording:
    """Read a profiler recording with the importer registered as ``format_name``."""
    known = importer_formats()
    if format_name not in _READERS:
        raise TraceFormatError(f"{path}: unknown trace format {format_name!r}; known formats: {', '.join(known)}")
    return _READERS[format_name](Path(path))


def _steps_from_annotations(recording: Recording, leading_step: bool = False) -> list[range]:
    """Index ranges of complete steps: each ends with the last activity launched in an optimizer span (the first
    dropped when its length differs from the second's, unless ``leading_step``)."""
    ends = []
    for lo, hi in recording.optimizer_spans:
        inside = [i for i, a in enumerate(recording.activities) if a.launch_us is not None and lo <= a.launch_us <= hi]
        if inside:
            ends.append(inside[-1])
    starts = [0] + [end + 1 for end in ends[:-1]]
    steps = [range(s, e + 1) for s, e in zip(starts, ends, strict=True)]
    if len(steps) >= 2 and len(steps[0]) != len(steps[1]) and not leading_step:
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


def _steps_from_repetition(recording: Recording) -> list[range]:
    activities = recording.activities
    period = _smallest_period([a.name for a in activities])
    if 2 * period > len(activities):
        raise StepDetectionError(
            f"{recording.path}: no optimizer annotations and the kernel sequence does not repeat; record at least "
            "two whole training steps, or keep torch's Optimizer.step annotations in the profile")
    if len(activities) % period == 0:
        offset = 0
    else:
        gaps = [max(0.0, b.start_us - (a.start_us + a.dur_us)) for a, b in itertools.pairwise(activities)]
        offset = (1 + max(range(len(gaps)), key=gaps.__getitem__)) % period
    return [range(s, s + period) for s in range(offset, len(activities) - period + 1, period)]


def split_steps(recording: Recording, leading_step: bool = False) -> list[range]:
    """Index ranges (into ``recording.activities``) of the recording's complete training steps; with
    ``leading_step`` the first step is kept even when its length differs from the next one's (a recording
    that starts at a step boundary, of steps that vary)."""
    steps = _steps_from_annotations(recording, leading_step) if recording.optimizer_spans else []
    return steps or _steps_from_repetition(recording)


def _in_spans(time_us: float | None, spans: list[tuple[float, float]]) -> bool:
    return time_us is not None and any(lo <= time_us <= hi for lo, hi in spans)


def label_phases(recording: Recording, step: range) -> list[Phase]:
    """The training phase of each activity of one step, in order."""
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


def _chosen_step(recording: Recording, step: int, leading_step: bool = False) -> tuple[int, range]:
    """The index and activity range of complete step ``step`` (Python indexing)."""
    steps = split_steps(recording, leading_step)
    if not steps:
        raise StepDetectionError(f"{recording.path}: no complete training step found; record at least one whole "
                                 "step including its optimizer.step()")
    try:
        chosen = steps[step]
    except IndexError:
        raise StepDetectionError(f"{recording.path}: step {step} does not exist; the recording holds {len(steps)} "
                                 f"complete steps (use 0..{len(steps) - 1} or -1 for the last)") from None
    return steps.index(chosen), chosen


def _kernel(activity: Activity, phase: Phase, gap_us: float) -> Kernel:
    category = classify(activity.name, activity.op.name if activity.op else None, activity.kind,
                        in_optimizer=phase is Phase.OPTIMIZER and activity.kind is Kind.KERNEL)
    return Kernel(
        name=activity.name, kind=activity.kind, category=category, phase=phase,
        duration_s=activity.dur_us * _US, gap_before_s=gap_us * _US, grid=activity.grid, block=activity.block,
        op=activity.op, dram_bytes=activity.bytes,
    )


def import_trace(path: Path, format_name: str = DEFAULT_FORMAT, step: int = -1, workload: str | None = None,
                 measurements: dict[str, float] | None = None, ref_mem_mhz: float | None = None,
                 observed_core_mhz: float | None = None, leading_step: bool = False) -> Trace:
    """Import one training step of a profiler recording.

    Args:
        path: the recording, e.g. a ``torch.profiler`` chrome trace ``.json`` or ``.json.gz`` (format ``kineto``).
        format_name: a registered importer (:func:`importer_formats`).
        step: which complete step to keep (Python indexing; default the last, the warmest).
        workload: label stored in the metadata (default: the file name without suffixes).
        measurements: whole-step measurements to store (e.g. joules per step).
        ref_mem_mhz: memory clock during the recording (MHz), when known.
        observed_core_mhz: median SM clock seen during the recording (MHz), when known.
        leading_step: keep the recording's first step even when its length differs from the second's (see
            :func:`split_steps`).
    """
    return step_trace(read_recording(Path(path), format_name), format_name, step, workload, measurements,
                      ref_mem_mhz, observed_core_mhz, leading_step)


def step_trace(recording: Recording, format_name: str = DEFAULT_FORMAT, step: int = -1, workload: str | None = None,
               measurements: dict[str, float] | None = None, ref_mem_mhz: float | None = None,
               observed_core_mhz: float | None = None, leading_step: bool = False) -> Trace:
    """:func:`import_trace` of a recording already read (:func:`read_recording`): several steps of one recording
    for the price of one read."""
    index, chosen = _chosen_step(recording, step, leading_step)
    acts = recording.activities
    kernels = []
    for i, phase in zip(chosen, label_phases(recording, chosen), strict=True):
        previous_end = acts[i - 1].start_us + acts[i - 1].dur_us if i > 0 else acts[i].start_us
        kernels.append(_kernel(acts[i], phase, max(0.0, acts[i].start_us - previous_end)))
    path = recording.path
    meta = TraceMeta(gpu=recording.gpu_name, workload=workload or path.name.split(".")[0],
                     source=f"{format_name}:{path.name}", ref_mem_mhz=ref_mem_mhz, ref_core_mhz=None,
                     observed_core_mhz=observed_core_mhz, step_index=index, measurements=measurements or {})
    return Trace(meta=meta, kernels=tuple(kernels))
