"""Importing PyTorch profiler (Kineto) traces, the default format: bundled recordings, steps, phases, bad files."""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdvfs.common.errors import StepDetectionError, TraceFormatError
from kdvfs.common.paths import RAW_DATA_DIR
from kdvfs.envs.trace.importing import import_trace, read_recording, split_steps
from kdvfs.envs.trace.trace import Kind, Phase

RAW = RAW_DATA_DIR / "h200"
RECORDINGS = ["trace_gpt3xl_24layer_b4", "trace_gpt2s_b16", "trace_resnet50_b128", "trace_gpt3xl_1layer_b4"]
MEASURED_KERNELS_PER_STEP = {"trace_gpt3xl_24layer_b4": 1438, "trace_gpt2s_b16": 756, "trace_resnet50_b128": 910}
KIND_OF_CAT = {"kernel": Kind.KERNEL, "gpu_memset": Kind.MEMSET, "gpu_memcpy": Kind.MEMCPY}


def _event_counts(path: Path) -> collections.Counter[Kind]:
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return collections.Counter(KIND_OF_CAT[e["cat"]] for e in events if e.get("cat") in KIND_OF_CAT)


@pytest.mark.parametrize("name", RECORDINGS)
def test_every_recording_splits_into_its_two_steps(name: str) -> None:
    path = RAW / f"{name}.json.gz"
    counts = _event_counts(path)
    steps = split_steps(read_recording(path))
    assert len(steps) == 2
    assert sum(len(s) for s in steps) == sum(counts.values())
    for index in range(2):
        trace = import_trace(path, step=index)
        for kind in Kind:
            assert trace.count(kind) * 2 == counts[kind]
    if name in MEASURED_KERNELS_PER_STEP:
        assert trace.count(Kind.KERNEL) == MEASURED_KERNELS_PER_STEP[name]
    assert trace.meta.gpu == "NVIDIA H200"


@pytest.mark.parametrize("name", RECORDINGS)
def test_phases_come_in_training_order(name: str) -> None:
    trace = import_trace(RAW / f"{name}.json.gz")
    order = [Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER, Phase.OTHER]
    ranks = [order.index(k.phase) for k in trace.kernels]
    assert ranks == sorted(ranks)
    phases = collections.Counter(k.phase for k in trace.kernels)
    assert phases[Phase.FORWARD] > 0 and phases[Phase.BACKWARD] > phases[Phase.FORWARD] / 2
    assert phases[Phase.OPTIMIZER] > 0


def test_gpt3xl_step_keeps_ops_shapes_and_gaps() -> None:
    trace = import_trace(RAW / "trace_gpt3xl_24layer_b4.json.gz", measurements={"step_time_s": 0.1586})
    gemm = next(k for k in trace.kernels if k.op and k.op.name == "aten::addmm")
    assert gemm.op is not None and len(gemm.op.input_dims) >= 3 and all(gemm.op.input_dims[1])
    assert trace.step_time_s == pytest.approx(trace.meta.measurements["step_time_s"], rel=0.05)
    memsets = [k for k in trace.kernels if k.kind is Kind.MEMSET]
    assert all(k.dram_bytes is not None for k in memsets)


def test_step_out_of_range_names_the_valid_choices() -> None:
    with pytest.raises(StepDetectionError, match="holds 2 complete steps"):
        import_trace(RAW / "trace_gpt2s_b16.json.gz", step=5)


def _kernel_event(name: str, ts: float, device: int = 0, external_id: int | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"device": device, "grid": [1, 1, 1], "block": [128, 1, 1]}
    if external_id is not None:
        args["External id"] = external_id
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": 5.0, "args": args}


def _recording(names: list[str], annotate_every: int | None = None) -> dict[str, Any]:
    events, ts = [], 0.0
    for i, name in enumerate(names):
        events.append(_kernel_event(name, ts + 10.0, external_id=i))
        events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::{name}", "ts": ts, "dur": 1.0, "tid": 1,
                       "args": {"External id": i}})
        if annotate_every and i % annotate_every == annotate_every - 1:
            events.append({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "ts": ts - 0.5,
                           "dur": 1.0, "tid": 1, "args": {}})
        ts += 20.0
    return {"traceEvents": events}


def _write(tmp_path: Path, document: Any, name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def _primitive_period(seq: list[str]) -> int:
    return next(p for p in range(1, len(seq) + 1) if len(seq) % p == 0 and seq == seq[:p] * (len(seq) // p))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from("abcde"), min_size=1, max_size=12), st.integers(2, 4))
def test_repeating_sequences_split_at_their_period(tmp_path_factory: pytest.TempPathFactory, step: list[str],
                                                   repeats: int) -> None:
    path = _write(tmp_path_factory.mktemp("rep"), _recording(step * repeats))
    steps = split_steps(read_recording(path))
    period = _primitive_period(step)
    assert [len(s) for s in steps] == [period] * (repeats * len(step) // period)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=10), st.integers(1, 4))
def test_optimizer_annotations_mark_step_ends(tmp_path_factory: pytest.TempPathFactory, step: list[str],
                                              repeats: int) -> None:
    path = _write(tmp_path_factory.mktemp("ann"), _recording(step * repeats, annotate_every=len(step)))
    steps = split_steps(read_recording(path))
    assert [len(s) for s in steps] == [len(step)] * repeats
    trace = import_trace(path)
    assert trace.kernels[-1].phase is Phase.OPTIMIZER


@pytest.mark.parametrize(
    ("content", "error", "message"),
    [
        (b"\x1f\x8b\x08\x00garbage", TraceFormatError, "corrupt or truncated"),
        (b'{"traceEvents": [', TraceFormatError, "corrupt or truncated"),
        (b"[1, 2, 3]", TraceFormatError, "not a PyTorch profiler chrome trace"),
        (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 0, "dur": 1}]}', TraceFormatError,
         "no GPU kernel"),
    ],
)
def test_bad_files(tmp_path: Path, content: bytes, error: type[Exception], message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(error, match=message) as caught:
        import_trace(path)
    assert str(path) in str(caught.value)


def test_several_devices_are_refused(tmp_path: Path) -> None:
    document = {"traceEvents": [_kernel_event("a", 0.0, device=0), _kernel_event("a", 10.0, device=1)]}
    with pytest.raises(TraceFormatError, match="several devices"):
        import_trace(_write(tmp_path, document))


def test_non_repeating_recording_without_annotations_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StepDetectionError, match="does not repeat"):
        import_trace(_write(tmp_path, _recording(list("abcdefg"))))
