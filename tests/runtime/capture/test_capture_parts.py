"""Pieces of the capture: the ncu step marker and enrichment, the CPU emulation's choice of kernels, the
example training scripts, and the steps captured on an H200 (bundled)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from examples import gpt, vision
from kdvfs.common.paths import RAW_DATA_DIR
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.trace import Category, Phase
from kdvfs.runtime.capture.capture_errors import CaptureError
from kdvfs.runtime.capture.cpu_emulation import emulate_gpu_recording
from kdvfs.runtime.capture.ncu_run import NCU_METRICS, NVTX_RANGE, StepMarker, enrich, ncu_argv

ORDER = [Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER, Phase.OTHER]


def test_step_marker_wraps_the_step_after_warmup() -> None:
    events: list[object] = []
    marker = StepMarker(3, start=lambda name: events.append(name) or 41, end=events.append)
    results = [marker.step() for _ in range(4)]
    assert results == [False, False, False, True] and events == [NVTX_RANGE, 41]


def test_ncu_command_profiles_only_the_marked_step(tmp_path: Path) -> None:
    child = ["python", "-m", "kdvfs.runtime.capture.capture_boot", "c.json", "t.py"]
    argv = ncu_argv("/opt/ncu", tmp_path / "log.csv", child)
    assert argv[:3] == ["/opt/ncu", "--clock-control", "none"] and argv[-5:] == \
        ["python", "-m", "kdvfs.runtime.capture.capture_boot", "c.json", "t.py"]
    assert argv[argv.index("--nvtx-include") + 1] == NVTX_RANGE and ",".join(NCU_METRICS) in argv
    assert str(tmp_path / "log.csv") in argv


def test_enrich_from_an_ncu_log() -> None:
    trace = open_trace("h200/gpt3xl-1layer-b4")
    bare = trace.__class__(trace.meta, tuple(k.__class__(**{**vars(k), "features": None}) for k in trace.kernels))
    enriched, matched = enrich(bare, RAW_DATA_DIR / "h200" / "ncu_gpt3xl_1layer.csv.gz")
    assert matched == 112 and int(enriched.has_features.sum()) == 112
    assert enriched.meta.source.endswith(" +ncu")
    with pytest.raises(CaptureError, match="ncu wrote no report"):
        enrich(bare, Path("/nonexistent/ncu.csv"))


def _op(name: str, ts: float, dur: float, tid: int = 1, ext: int = 0) -> dict[str, object]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1,
            "args": {"External id": ext}}


def test_emulation_picks_outermost_working_ops(tmp_path: Path) -> None:
    events = [
        _op("aten::linear", 0, 10, ext=1), _op("aten::t", 1, 1, ext=2), _op("aten::addmm", 3, 6, ext=3),
        _op("aten::copy_", 4, 1, ext=4),
        _op("autograd::engine::evaluate_function: AddmmBackward0", 20, 10, ext=5), _op("aten::mm", 21, 5, ext=6),
        _op("aten::view", 40, 1, ext=7),
    ]
    source = tmp_path / "cpu.json"
    source.write_text(json.dumps({"traceEvents": events}))
    assert emulate_gpu_recording(source, tmp_path / "gpu.json.gz") == 2
    document = json.loads(gzip.decompress((tmp_path / "gpu.json.gz").read_bytes()))
    kernels = [e for e in document["traceEvents"] if e["cat"] == "kernel"]
    assert [(k["name"], k["args"]["External id"]) for k in kernels] == [("aten::addmm", 3), ("aten::mm", 6)]
    threads = {e["name"]: e["tid"] for e in document["traceEvents"] if e["cat"] == "cpu_op"}
    assert threads["aten::mm"] == "1 (autograd)" and threads["aten::addmm"] == 1


@pytest.mark.parametrize("example", [gpt, vision])
def test_examples_train_on_the_cpu(example: object, capsys: pytest.CaptureFixture[str]) -> None:
    loss = example.main(["--device", "cpu", "--steps", "2"])  # type: ignore[attr-defined]
    assert loss == loss and loss >= 0 and "2 steps" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["h200/capture-gpt3xl-b4", "h200/capture-gpt2s-b16", "h200/capture-resnet50-b128"])
def test_steps_captured_on_the_h200(name: str) -> None:
    """The bundled captures: phases in training order, optimizer kernels classified, shapes and measurements kept."""
    trace = open_trace(name)
    ranks = [ORDER.index(k.phase) for k in trace.kernels]
    assert ranks == sorted(ranks) and trace.meta.gpu == "NVIDIA H200" and trace.meta.step_index == 1
    by_phase = {phase: {k.category for k in trace.kernels if k.phase is phase} for phase in ORDER}
    assert by_phase[Phase.OPTIMIZER] == {Category.OPTIMIZER}
    assert Category.GEMM in by_phase[Phase.FORWARD] and Category.GEMM in by_phase[Phase.BACKWARD]
    assert all(k.op is not None and k.op.input_dims for k in trace.kernels)
    measured = trace.meta.measurements
    assert measured["energy_j_per_step"] > 0 and measured["step_time_s"] > 0 and measured["window_s"] >= 6
    assert trace.meta.ref_mem_mhz == 3201 and trace.meta.observed_core_mhz
