"""The trace set of a capture whose steps vary: ``.shape-K`` file names, the loader and its checks, and the
window prediction shape by shape."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kdvfs.common.errors import TraceFormatError
from kdvfs.envs.trace.format import save_trace
from kdvfs.envs.trace.shape import StepShape
from kdvfs.envs.trace.trace import Category, Kernel, Kind, Phase, Trace, TraceMeta
from kdvfs.envs.trace.trace_set import (
    load_trace_set,
    main_path,
    shape_path,
    sibling_paths,
    tokens_scaled,
    window_prediction,
)

SMALL, MIDDLE, LARGE = StepShape.of([(8, 64)]), StepShape.of([(8, 128)]), StepShape.of([(8, 512)])
DISTRIBUTION = ((MIDDLE, 5), (SMALL, 3), (LARGE, 2))


def shaped(shape: StepShape, distribution: tuple[tuple[StepShape, int], ...] = DISTRIBUTION) -> Trace:
    meta = TraceMeta(gpu="g", workload="w", source="s", step_shape=shape, shape_distribution=distribution)
    return Trace(meta, (Kernel("k", Kind.KERNEL, Category.GEMM, Phase.FORWARD, 1e-3 * shape.tokens / 64, 0.0),))


def write_set(path: Path, shapes: list[StepShape]) -> None:
    for number, shape in enumerate(shapes):
        save_trace(shaped(shape), shape_path(path, number))


@pytest.mark.parametrize(("name", "sibling"), [("run.trace.json", "run.shape-2.trace.json"),
                                               ("run.trace.json.gz", "run.shape-2.trace.json.gz"),
                                               ("run.json", "run.shape-2.json")])
def test_sibling_names(name: str, sibling: str) -> None:
    assert shape_path(Path("d") / name, 2) == Path("d") / sibling
    assert shape_path(name, 0) == Path(name)
    assert main_path(Path("d") / sibling) == Path("d") / name and main_path(name) == Path(name)


def test_round_trip_of_a_set(tmp_path: Path) -> None:
    path = tmp_path / "run.trace.json"
    write_set(path, [MIDDLE, SMALL, LARGE])
    save_trace(shaped(SMALL), tmp_path / "run.shape-4.trace.json")  # after a gap: no member
    save_trace(shaped(SMALL), tmp_path / "other.shape-1.trace.json")
    traces = load_trace_set(path)
    assert [t.meta.step_shape for t in traces] == [MIDDLE, SMALL, LARGE]
    assert all(t.meta.shape_distribution == DISTRIBUTION for t in traces)
    assert sibling_paths(path) == [tmp_path / "run.shape-1.trace.json", tmp_path / "run.shape-2.trace.json"]
    assert [t.meta.step_shape for t in load_trace_set([path, tmp_path / "run.shape-4.trace.json"])] == [
        MIDDLE, SMALL, LARGE, SMALL]


def test_single_trace_is_a_set_of_one(tmp_path: Path) -> None:
    path = tmp_path / "one.trace.json"
    save_trace(replace(shaped(SMALL), meta=TraceMeta(gpu="g", workload="w", source="s")), path)
    assert len(load_trace_set(str(path))) == 1


def test_sibling_of_another_capture_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "run.trace.json"
    write_set(path, [MIDDLE])
    save_trace(shaped(SMALL, ((SMALL, 4),)), shape_path(path, 1))
    with pytest.raises(TraceFormatError, match=r"run.shape-1.trace.json is from another capture .* delete it"):
        load_trace_set(path)


def test_window_prediction_sums_each_step_of_its_own_shape() -> None:
    captured = {MIDDLE: 2.0, LARGE: 8.0}
    prediction = window_prediction(DISTRIBUTION, captured)
    # SMALL (512 tokens) is predicted from MIDDLE (1024 tokens), the nearest, scaled by tokens: 1.0
    assert prediction == {"total": 5 * 2.0 + 3 * 1.0 + 2 * 8.0, "steps": 10.0, "captured_steps": 7.0}
    assert tokens_scaled(LARGE, captured) == 8.0
    assert window_prediction(DISTRIBUTION, captured, uncaptured=lambda shape: 0.0)["total"] == 26.0


def test_window_prediction_adds_set_up_to_the_steps_that_paid_it() -> None:
    """The capture's fit counts set-up per step that ran a new forward call: the check adds it as often; an older
    capture, which does not say, gets it once per shape."""
    captured = {MIDDLE: 2.0, LARGE: 8.0}
    plain = window_prediction(DISTRIBUTION, captured)["total"]
    assert window_prediction(DISTRIBUTION, captured, first_seen=0.5, first_seen_steps=4.0)["total"] == plain + 2.0
    assert window_prediction(DISTRIBUTION, captured, first_seen=0.5)["total"] == plain + 0.5 * len(DISTRIBUTION)
