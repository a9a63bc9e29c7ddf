"""``kdvfs capture`` of a run whose steps vary (CPU test mode, fake NVML, the real profiler): one trace per
shape with its own measurements, the window's distribution, the report; a fixed-shape run as before."""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.shape import StepShape
from kdvfs.envs.trace.trace_set import load_trace_set
from kdvfs.runtime.capture.shape_rounds import MIN_VARYING_WINDOW_STEPS, WindowShapes, choose_targets
from kdvfs.runtime.cli import main
from kdvfs.runtime.cli.offline.predict import stall_power_w, window_check
from tests.schema_check import strict_loads, validate

CAPTURE = ["capture", "--cpu-test-mode", "--nvml-module", "kdvfs.runtime.testing.nvml", "--warmup", "2",
           "--energy-window-s", "0.05", "--json"]
TRAIN = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batches = {batches}
for step in range(400):
    optimizer.zero_grad()
    model(torch.randn(batches[step % len(batches)], 32)).square().sum().backward()
    optimizer.step()
"""


def capture(capsys: pytest.CaptureFixture[str], folder: Path, batches: list[int], *options: str) -> dict:
    script = folder / "train.py"
    script.write_text(TRAIN.format(batches=batches))
    code = main([*CAPTURE, *options, "-o", str(folder / "run.trace.json"), "--", sys.executable, str(script)])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = strict_loads(out)
    validate(report, "capture")
    return dict(report)


def test_steps_of_three_shapes_give_three_traces(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    save = tmp_path / "run.shape-3.trace.json"
    save.write_text("a previous capture's")
    report = capture(capsys, tmp_path, [4, 16, 64])
    traces = load_trace_set(tmp_path / "run.trace.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.shape-1.trace.json", "run.shape-2.trace.json",
                                                          "run.trace.json", "train.py"]
    shapes = [t.meta.step_shape for t in traces]
    assert sorted(s.batch for s in shapes if s) == [4, 16, 64]
    window_steps = report["window_steps"]
    assert window_steps >= MIN_VARYING_WINDOW_STEPS
    for trace in traces:
        shape = trace.meta.step_shape
        assert shape is not None
        gemm_inputs = {k.op.input_dims[1] for k in trace.kernels if k.op and k.op.name == "aten::addmm"}
        assert gemm_inputs == {(shape.batch, 32), (shape.batch, 64)}  # the profiled step is of its shape
        distribution = dict(trace.meta.shape_distribution)
        assert sum(distribution.values()) == window_steps and set(distribution) == set(shapes)
        m = trace.meta.measurements
        assert m["shape_window_steps"] == distribution[shape] and m["window_steps"] == window_steps
        assert m["energy_j_per_step"] == pytest.approx(m["avg_power_w"] * m["step_time_s"])
        assert m["window_energy_j"] == pytest.approx(m["avg_power_w"] * m["window_s"])
    counts = Counter({s: n for s, n in traces[0].meta.shape_distribution})
    assert shapes[0] == counts.most_common(1)[0][0]  # the main trace is the most frequent shape
    summary = report["shapes"]
    assert [entry["output"] for entry in summary["captured"]] == [
        str(tmp_path / name) for name in ("run.trace.json", "run.shape-1.trace.json", "run.shape-2.trace.json")]
    assert len(summary["seen"]) == 3 and summary["missed"] == [] and summary["tokens_range"] == [4 * 32, 64 * 32]
    assert len(summary["window_step_times_s"]) == len(summary["window_first_seen"]) == window_steps
    assert traces[0].meta.measurements["window_first_seen_steps"] == sum(summary["window_first_seen"])
    assert min(summary["window_step_times_s"]) > 0
    assert report["step_time_s"] == traces[0].meta.measurements["step_time_s"]
    assert main(["predict", "--trace", str(tmp_path / "run.trace.json"), "--gpu", "h200", "--samples", "0",
                 "--json"]) == 0
    predicted = strict_loads(capsys.readouterr().out)
    validate(predicted, "predict")
    assert predicted["window"]["steps"] == window_steps  # the window check of a capture whose steps vary
    window = predicted["window"]  # in seconds too: the window's length against its steps' predicted times
    assert window["measured_s"] > 0 and window["time_error"] == pytest.approx(
        window["predicted_s"] / window["measured_s"] - 1)
    assert window["stall_s"] == traces[0].meta.measurements["window_stall_s"] >= 0


def test_the_window_check_takes_the_stalls_as_measured_and_idle(capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:
    """A stall (a kernel module loaded on first use: seen on an H100, 1.7 s in a window of 0.2 s steps) is no
    step's shape: the window check adds its seconds as measured, at the cost model's idle power at auto's clocks."""
    capture(capsys, tmp_path, [4, 16, 64])
    path, profile = str(tmp_path / "run.trace.json"), load_profile("h200")
    trace = load_trace(path)
    calm = replace(trace, meta=replace(trace.meta, measurements={**trace.meta.measurements, "window_stall_s": 0.0}))
    stalled = replace(trace, meta=replace(trace.meta, measurements={**trace.meta.measurements, "window_stall_s": 1.5}))
    before, after = window_check(path, calm, profile), window_check(path, stalled, profile)
    assert before is not None and after is not None and after["stall_s"] == 1.5
    assert after["predicted_s"] == pytest.approx(before["predicted_s"] + 1.5)
    assert after["predicted_j"] == pytest.approx(before["predicted_j"] + 1.5 * stall_power_w(profile))
    assert profile.power.idle_w < stall_power_w(profile) < profile.power.limit_w


def test_fixed_shape_steps_give_one_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = capture(capsys, tmp_path, [16])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.trace.json", "train.py"]
    trace = load_trace(tmp_path / "run.trace.json")
    shape = StepShape.of([(16, 32)])
    assert trace.meta.step_shape == shape
    assert trace.meta.shape_distribution == ((shape, report["window_steps"]),)
    assert trace.meta.measurements["step_time_s"] == report["step_time_s"]
    assert "window_energy_j" not in trace.meta.measurements
    assert [entry["output"] for entry in report["shapes"]["captured"]] == [str(tmp_path / "run.trace.json")]


def test_one_shape_asked_keeps_one_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = capture(capsys, tmp_path, [4, 16, 64], "--shapes", "1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.trace.json", "train.py"]
    assert len(report["shapes"]["seen"]) == 3 and len(report["shapes"]["captured"]) == 1


def test_missed_shapes_are_reported(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = capture(capsys, tmp_path, [4, 16, 64], "--max-profiled-steps", "1")
    assert len(report["shapes"]["captured"]) == 1 and len(report["shapes"]["missed"]) == 2
    assert report["shapes"]["profiled_steps"] == 1


def test_targets_are_the_most_frequent_and_the_extremes() -> None:
    shapes = {n: StepShape.of([(n, 8)]) for n in (1, 2, 3, 4, 5)}
    counts = Counter({shapes[1]: 1, shapes[2]: 4, shapes[3]: 9, shapes[4]: 3, shapes[5]: 2})
    assert choose_targets(counts, 4) == [shapes[3], shapes[1], shapes[5], shapes[2]]
    assert choose_targets(counts, 1) == [shapes[3]]
    assert choose_targets(Counter(), 4) == []


def test_targets_of_shapes_seen_once_spread_over_the_range() -> None:
    # packing: every window shape seen once; the picks after the extremes are the farthest from those chosen,
    # not the smallest (which would leave the upper part of the range to the step model's bridging)
    shapes = [StepShape.of([(1, n)]) for n in (1000, 1100, 1200, 1300, 1400, 2000, 2600, 3200, 4000)]
    targets = choose_targets(Counter(dict.fromkeys(shapes, 1)), 4)
    assert targets == [shapes[0], shapes[8], shapes[5], shapes[4]]
    assert choose_targets(Counter(dict.fromkeys(shapes, 1)), 5)[4] == shapes[6]


@pytest.mark.slow
def test_hf_trainer_with_dynamic_padding(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    output = tmp_path / "sft.trace.json"
    code = main([*CAPTURE, "-o", str(output), "--", sys.executable, str(REPO_ROOT / "examples" / "hf_sft.py"),
                 "--size", "tiny", "--device", "cpu", "--steps", "200", "--max-len", "96"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    traces = load_trace_set(output)
    assert len(report["shapes"]["seen"]) > 1 and len(traces) == len(report["shapes"]["captured"]) > 1
    for trace in traces:
        shape = trace.meta.step_shape
        assert shape is not None and shape.batch == 8 and 64 <= shape.seq <= 96
        assert sum(n for _, n in trace.meta.shape_distribution) == report["window_steps"]


def test_script_that_ends_while_looking_for_shapes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN.format(batches=[4, 16, 64]).replace("range(400)", "range(28)"))
    code = main([*CAPTURE[:-1], "--energy-window-s", "0.0001", "-o", str(tmp_path / "run.trace.json"), "--",
                 sys.executable, str(script)])
    err = capsys.readouterr().err
    assert code == 2 and "while profiling its step shapes" in err and "--max-profiled-steps" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_three_captured_shapes_carry_the_step_models_left_out_error() -> None:
    from kdvfs.common.paths import DATA_DIR
    from kdvfs.envs.trace.format import load_trace
    from kdvfs.runtime.capture.shape_set import with_step_model_errors

    folder = DATA_DIR / "traces" / "h200" / "workloads"
    traces = [load_trace(folder / f"bert-b32-s{seq}.trace.json.gz") for seq in (128, 256, 512)]
    marked, report = with_step_model_errors(traces)
    assert report is not None and [entry["shape"] for entry in report] == [t.meta.step_shape.key for t in traces]
    for trace, entry in zip(marked, report, strict=True):
        assert trace.meta.measurements["step_model_kernel_time_error_pct"] == entry["kernel_time_error_pct"]
    assert with_step_model_errors(traces[:2]) == (traces[:2], None)


def test_a_longer_step_never_gets_a_shorter_time_when_new_shapes_pay_set_up() -> None:
    """Early in a run most shapes come for the first time and pay host set-up while the frequent longest shape
    repeats warm: the per-shape means fall with length; the warm fit does not, and prices set-up apart."""
    rng = np.random.default_rng(0)
    lengths = [1024 if rng.random() < 0.4 else int(rng.integers(100, 1000)) for _ in range(60)]
    shapes = tuple(StepShape.of([(8, n)] * 3) for n in lengths)
    first = [shape not in shapes[:i] for i, shape in enumerate(shapes)]
    times = tuple(0.02 + 1e-4 * n + (0.08 if new else 0.0) + float(rng.normal(0, 1e-4))
                  for n, new in zip(lengths, first, strict=True))
    window = WindowShapes(shapes, times)
    assert window.first_seen == tuple(first)
    ordered = sorted(set(shapes), key=lambda s: s.tokens)
    warm = [window.step_time_s(shape) for shape in ordered]
    assert all(t is not None for t in warm) and warm == sorted(warm)  # type: ignore[type-var]
    for shape, time_s in zip(ordered, warm, strict=True):
        assert time_s == pytest.approx(0.02 + 1e-4 * shape.seq, rel=0.02)
    fit = window.warm_fit
    assert fit is not None and fit[2] == pytest.approx(0.08, rel=0.05)


def test_a_window_of_new_shapes_with_a_stall_still_prices_each_shape_by_its_lengths() -> None:
    """Seen on the H200 (an encoder-decoder, two independent lengths): every window step was its shape's first
    and one stalled; the fit put everything in its constant and gave every shape the window's mean time."""
    rng = np.random.default_rng(1)
    pairs = [(int(rng.integers(300, 1024)), int(rng.integers(150, 512))) for _ in range(20)]
    shapes = tuple(StepShape.of([(8, a), (8, b)]) for a, b in pairs)
    times = [0.05 + 2e-4 * a + 1e-4 * b + float(rng.normal(0, 2e-3)) for a, b in pairs]
    times[0] += 4.0  # a stall
    window = WindowShapes(shapes, tuple(times))
    assert all(window.first_seen)
    fit = window.warm_fit
    assert fit is not None and fit[2] == 0.0
    assert window.stall_s == pytest.approx(4.0, abs=0.02)  # the stall's seconds beyond the fit, for the check
    for (a, b), shape in zip(pairs[1:], shapes[1:], strict=True):
        assert window.step_time_s(shape) == pytest.approx(0.05 + 2e-4 * a + 1e-4 * b, rel=0.05)


def test_set_up_is_not_priced_apart_on_one_warm_step() -> None:
    """Seen on an H100 (gradient accumulation): 19 of the window's 20 steps ran a micro-batch new to the process,
    and the one that did not set the set-up's price alone (half of every step). Under three warm steps set-up stays
    in the line: each shape's time is its steps' whole time."""
    rng = np.random.default_rng(3)
    pairs = [(int(rng.integers(300, 1024)), int(rng.integers(300, 1024))) for _ in range(20)]
    shapes = tuple(StepShape.of([(8, a), (8, b)]) for a, b in pairs)
    times = tuple(0.15 + 1e-4 * (a + b) + float(rng.normal(0, 0.03)) for a, b in pairs)
    new = tuple(i != 7 for i in range(20))
    window = WindowShapes(shapes, times, new)
    fit = window.warm_fit
    assert fit is not None and fit[2] == 0.0
    assert np.mean([window.step_time_s(shape) for shape in shapes]) == pytest.approx(np.mean(times), rel=0.05)


def test_each_rounds_recording_is_read_once_however_many_shapes_it_holds(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a round's recording parses all its steps (on a GPU, every kernel, launch and op of nine steps):
    the traces of a capture whose steps vary took minutes on an H100 when each shape read its round again."""
    import torch

    from kdvfs.envs.trace.importers import kineto
    from kdvfs.runtime.capture.session import Capture
    from kdvfs.runtime.testing.fake_nvml import EnergyFakeNvml, h200_from_probe

    reads: list[str] = []
    read_input = kineto.read_input

    def counted(path: Path, error: type[Exception]) -> str:
        reads.append(Path(path).name)
        return read_input(path, error)

    monkeypatch.setattr(kineto, "read_input", counted)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with Capture(tmp_path / "run.trace.json", EnergyFakeNvml([h200_from_probe()], power_w=250.0), warmup=2,
                 energy_window_s=0.05, cpu_test_mode=True) as capture:
        for step in range(400):
            optimizer.zero_grad()
            model(torch.randn((4, 16, 64)[step % 3], 32)).square().sum().backward()
            optimizer.step()
            if capture.step():
                break
    assert capture.report is not None and len(capture.report.shapes["captured"]) == 3
    assert len(reads) == 1  # the three shapes come up in the first round


@pytest.mark.parametrize(("middle", "stand_in"), [(7, 7), (5, 9)])
def test_a_stand_in_is_a_warm_step_and_a_shape_keeps_its_warm_recording(tmp_path: Path, middle: int,
                                                                        stand_in: int) -> None:
    """A step that runs a shape for the first time pays one-time host set-up (tens of ms of idle gaps on a GPU):
    a target that never comes (10) is stood in for by the nearest warm profiled shape unless it lies farther than
    the nearest (9, first seen) by more than the step model's cover factor (7 does, 5 does not), and a shape
    profiled first cold, then warm, keeps its warm step."""
    import torch

    from kdvfs.runtime.capture.shape_rounds import ROUND_STEPS, ShapeRounds
    from kdvfs.runtime.step_shapes import ShapeProbe

    model = torch.nn.Linear(4, 2)
    probe = ShapeProbe().attach(model)

    def run(length: int) -> int:
        model(torch.zeros(2, length, 4))
        return probe.mark_step()

    for length in (2, 3):  # the window
        run(length)
    shape = {n: StepShape.of([(2, n, 4)]) for n in (2, 3, middle, 9, 10)}
    rounds = ShapeRounds([shape[2], shape[10]], probe, tmp_path, ROUND_STEPS, lambda: 0.0, cpu_only=True)
    rounds.start()
    profiled = (9, middle, middle, 3, 2, 2, 2, 2)
    assert len(profiled) == ROUND_STEPS
    assert not rounds.step(run(2))  # the profiler's warm-up step
    done = [rounds.step(run(length)) for length in profiled]
    assert done == [False] * (ROUND_STEPS - 1) + [True]
    assert rounds.first_seen == {shape[9]}
    assert rounds.profiled[shape[middle]][1] == profiled.index(middle) + 1 - ROUND_STEPS  # its second, warm step
    assert rounds.stood_in == {shape[stand_in]: shape[10]}
    assert rounds.captured[shape[stand_in]] == rounds.profiled[shape[stand_in]]


def test_set_up_follows_the_micro_batches_new_to_the_process_not_the_whole_steps_shape() -> None:
    """Gradient accumulation: every step's whole shape (both micro-batches) is new to the window, but only the steps
    that run a micro-batch length the process had not run pay set-up; with the probe's flags the fit prices it
    apart and gives each shape its warm time."""
    rng = np.random.default_rng(2)
    lengths = tuple(range(64, 1600, 64))
    pairs = [(int(rng.choice(lengths)), int(rng.choice(lengths))) for _ in range(60)]
    shapes = tuple(StepShape.of([(8, a), (8, b)]) for a, b in pairs)
    ran: set[int] = {128, 256}  # the warm-up ran these
    new = []
    for a, b in pairs:
        new.append(a not in ran or b not in ran)
        ran |= {a, b}
    times = tuple(0.02 + 1e-4 * (a + b) + (0.08 if n else 0.0) + float(rng.normal(0, 1e-4))
                  for (a, b), n in zip(pairs, new, strict=True))
    assert 0 < sum(new) < len(new) and len(set(shapes)) > 0.5 * len(shapes)
    window = WindowShapes(shapes, times, tuple(new))
    fit = window.warm_fit
    assert fit is not None and fit[2] == pytest.approx(0.08, rel=0.05)
    for (a, b), shape in zip(pairs, shapes, strict=True):
        assert window.step_time_s(shape) == pytest.approx(0.02 + 1e-4 * (a + b), rel=0.05)
