"""The step model: exact where the truth is linear in tokens, alignment robust to inserted and dropped kernels,
``covers`` false far outside, leave-one-shape-out error bounded on the recorded H200 captures."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model import step_model
from kdvfs.envs.model.step.align import align, slots, token_ids
from kdvfs.envs.model.step.shape_fit import Terms
from kdvfs.envs.model.step.validation import leave_one_out
from kdvfs.envs.model.step_model import StepModel, StepModelError
from kdvfs.envs.synthetic.generator import generate_transformer_trace, load_workload
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.shape import StepShape
from kdvfs.envs.trace.trace import Trace

WORKLOADS = REPO_ROOT / "data" / "traces" / "h200" / "workloads"
BATCH = 4


@pytest.fixture(scope="module")
def base() -> Trace:
    config = replace(load_workload("gpt2s"), layers=2, seq=256, batch=BATCH)
    return generate_transformer_trace(config, load_profile("h200"))


def _linear(base: Trace, seq: int, seed: int = 0) -> Trace:
    """``base``'s kernels with duration and gap linear in the tokens (fixed random coefficients per kernel)."""
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(1e-6, 5e-6, len(base)), rng.uniform(1e-9, 5e-9, len(base))
    c, d = rng.uniform(0, 2e-6, len(base)), rng.uniform(0, 1e-9, len(base))
    tokens = BATCH * seq
    kernels = tuple(replace(k, duration_s=float(a[i] + b[i] * tokens), gap_before_s=float(c[i] + d[i] * tokens))
                    for i, k in enumerate(base.kernels))
    return Trace(replace(base.meta, step_shape=StepShape.of([(BATCH, seq)])), kernels)


def test_exact_where_the_truth_is_linear_in_tokens(base: Trace) -> None:
    model = StepModel.fit([_linear(base, seq) for seq in (128, 256, 512, 1024)])
    truth = _linear(base, 384)
    predicted = model.predict(StepShape.of([(BATCH, 384)]))
    assert len(predicted) == len(truth)
    np.testing.assert_allclose(predicted.duration_s, truth.duration_s, rtol=1e-6)
    np.testing.assert_allclose(predicted.gap_before_s, truth.gap_before_s, rtol=1e-6, atol=1e-12)
    assert predicted.meta.step_shape == StepShape.of([(BATCH, 384)])
    assert "step-model" in predicted.meta.source and "4x128" in predicted.meta.source
    again = model.predict(StepShape.of([(BATCH, 384)]))
    assert np.array_equal(again.duration_s, predicted.duration_s)  # deterministic


def test_a_captured_shape_predicts_its_own_trace(base: Trace) -> None:
    traces = [_linear(base, seq) for seq in (128, 512)]
    assert StepModel.fit(traces).predict(StepShape.of([(BATCH, 512)])) is traces[1]


def test_an_inserted_or_dropped_kernel_shifts_no_other_pair(base: Trace) -> None:
    kernels = list(base.kernels)
    inserted = Trace(base.meta, (*kernels[:40], kernels[7], *kernels[40:]))
    dropped = Trace(base.meta, (*kernels[:60], *kernels[61:]))
    a, b, c = token_ids([base, inserted, dropped])
    to_inserted, to_dropped = align(a, b), align(a, c)
    assert np.array_equal(to_inserted, np.r_[np.arange(40), np.arange(41, len(base) + 1)])
    assert to_dropped[60] == -1
    assert np.array_equal(np.delete(to_dropped, 60), np.arange(len(base) - 1))


def test_each_executed_kernel_stands_on_its_partner_or_the_last_partner_before_it(base: Trace) -> None:
    kernels = list(base.kernels)
    inserted = Trace(base.meta, (*kernels[:40], kernels[7], *kernels[40:]))
    assert np.array_equal(slots(base, base), np.arange(len(base)))
    assert np.array_equal(slots(base, inserted), np.r_[np.arange(40), 39, np.arange(40, len(base))])
    dropped = Trace(base.meta, (*kernels[:60], *kernels[61:]))
    assert np.array_equal(slots(base, dropped), np.delete(np.arange(len(base)), 60))


def test_a_kernel_only_some_shapes_have_is_predicted(base: Trace) -> None:
    traces = [_linear(base, seq) for seq in (128, 256, 512)]
    extra = traces[2].kernels[5]
    traces[2] = Trace(traces[2].meta, (*traces[2].kernels[:30], extra, *traces[2].kernels[30:]))
    predicted = StepModel.fit(traces).predict(StepShape.of([(BATCH, 640)]))
    assert len(predicted) == len(traces[2])  # the nearest shape's sequence is the template
    assert predicted.kernels[30].duration_s > 0


def test_covers_the_captured_range_and_not_far_outside(base: Trace) -> None:
    model = StepModel.fit([_linear(base, seq) for seq in (128, 512)])
    assert model.covers(StepShape.of([(BATCH, 300)]))
    assert model.covers(StepShape.of([(BATCH, 700)]))  # near the edge
    assert not model.covers(StepShape.of([(BATCH, 4096)]))
    assert not model.covers(StepShape.of([(64, 256)]))
    assert not model.covers(StepShape.of([(BATCH, 3, 224, 224)]))
    single = StepModel.fit([_linear(base, 256)])
    assert single.covers(StepShape.of([(BATCH, 256)])) and not single.covers(StepShape.of([(BATCH, 300)]))


def test_traces_without_a_shape_or_of_one_shape_twice_are_refused(base: Trace) -> None:
    with pytest.raises(StepModelError, match=r"no meta\.step_shape"):
        StepModel.fit([Trace(replace(base.meta, step_shape=None), base.kernels)])
    with pytest.raises(StepModelError, match="same step shape"):
        StepModel.fit([_linear(base, 256), _linear(base, 256, seed=1)])


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_leave_one_shape_out_error_is_bounded_on_recorded_steps(family: str) -> None:
    traces = [load_trace(p) for p in sorted(Path(WORKLOADS).glob(f"{family}-*.trace.json.gz"))]
    errors = leave_one_out(traces)
    assert len(errors) == len(traces)
    assert max(abs(e.kernel_time_error_pct) for e in errors) < 5.0
    assert max(e.weighted_duration_error_pct for e in errors) < 10.0
    interior = [e for e in errors if not e.edge]
    assert interior and max(abs(e.kernel_time_error_pct) for e in interior) < 3.0


def test_leave_one_out_aligns_each_pair_of_steps_once(base: Trace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture's check of its shapes refits the step model once per shape left out; aligning the kernels of two
    steps is O(K1 x K2) (minutes in all for nine 4,000-kernel steps when each model aligned its pairs again)."""
    from kdvfs.envs.model import step_model

    traces = [_linear(base, seq, seed=seq) for seq in (128, 192, 256, 384, 512)]
    calls: list[int] = []

    def counted(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        calls.append(1)
        return align(a, b)

    monkeypatch.setattr(step_model, "align", counted)
    errors = leave_one_out(traces)
    assert len(calls) == len(traces) * (len(traces) - 1) // 2
    for held, error in zip(traces, errors, strict=True):  # what a model fitted on the others alone predicts
        shape = held.meta.step_shape
        assert shape is not None
        alone = StepModel.fit([t for t in traces if t is not held]).predict(shape)
        assert error.kernel_time_error_pct == pytest.approx(100.0 * (alone.busy_s / held.busy_s - 1.0), rel=1e-9)


def _two_lengths(base: Trace, source: int, target: int) -> Trace:
    """``base``'s first half of kernels linear in the input tokens, the second half in the label tokens (fixed
    random coefficients): an encoder-decoder step, keyed like a T5's under the HF Trainer."""
    rng = np.random.default_rng(3)
    a, b = rng.uniform(1e-6, 5e-6, len(base)), rng.uniform(1e-9, 5e-9, len(base))
    half = len(base) // 2
    tokens = np.where(np.arange(len(base)) < half, BATCH * source, BATCH * target)
    kernels = tuple(replace(k, duration_s=float(a[i] + b[i] * tokens[i])) for i, k in enumerate(base.kernels))
    shape = StepShape.of([(BATCH, source), (BATCH, target), (BATCH, source), (BATCH, target), ()])
    return Trace(replace(base.meta, step_shape=shape), kernels)


def test_an_encoder_decoders_two_lengths_are_both_variables(base: Trace) -> None:
    """Keyed on the first input alone, the label tokens' kernels could not be predicted: a step with the same
    input length and another label length would get the captured one's kernel time."""
    captured = [(128, 32), (256, 96), (512, 64), (384, 160), (192, 128), (448, 48)]
    model = StepModel.fit([_two_lengths(base, s, t) for s, t in captured])
    for source, target in ((256, 32), (300, 140), (512, 160)):
        truth = _two_lengths(base, source, target)
        assert truth.meta.step_shape is not None and model.covers(truth.meta.step_shape)
        predicted = model.predict(truth.meta.step_shape)
        np.testing.assert_allclose(predicted.duration_s, truth.duration_s, rtol=1e-6)
        assert model.kernel_time_s(truth.meta.step_shape) == pytest.approx(truth.busy_s, rel=1e-6)


def _micro_batches(base: Trace, first: int, second: int, noise: tuple[float, float] = (0.0, 0.0)) -> Trace:
    """A step of two micro-batches of their own lengths (gradient accumulation): ``base``'s first half of kernels
    the first micro-batch's (linear and score terms in its tokens alone, fixed random coefficients), the second
    half the second's; each half scaled by 1 + its ``noise`` (the captures' jitter)."""
    rng = np.random.default_rng(3)
    a, b, c = rng.uniform(1e-6, 5e-6, len(base)), rng.uniform(1e-9, 5e-9, len(base)), rng.uniform(0, 2e-12, len(base))
    own = np.arange(len(base)) < len(base) // 2
    length = np.where(own, first, second)
    duration = (a + b * BATCH * length + c * BATCH * length * length) * np.where(own, 1 + noise[0], 1 + noise[1])
    shape = StepShape.of([(BATCH, first), (BATCH, first), (BATCH, second), (BATCH, second)])
    return Trace(replace(base.meta, step_shape=shape),
                 tuple(replace(k, duration_s=float(duration[i])) for i, k in enumerate(base.kernels)))


def test_a_kernel_of_one_micro_batch_takes_no_cross_term_from_noise(base: Trace,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """With 2% jitter per micro-batch, the least-residual support of some kernels (and groups) holds a cross term
    (one micro-batch's tokens times the other's length) that the corner, both micro-batches longest, extrapolates;
    a cross term taken only where it lowers the AICc keeps the corner's kernel time within 2%."""
    captured = [(368, 423), (434, 988), (466, 497), (482, 347), (489, 811), (568, 696), (642, 367), (839, 374)]
    noise = np.random.default_rng(8).normal(0.0, 0.02, (len(captured), 2))
    traces = [_micro_batches(base, first, second, (float(e0), float(e1)))
              for (first, second), (e0, e1) in zip(captured, noise, strict=True)]
    corner = _micro_batches(base, 1024, 1024)
    assert corner.meta.step_shape is not None

    def error(model: StepModel) -> float:
        assert model.terms is Terms.QUADRATIC and corner.meta.step_shape is not None
        return model.predict(corner.meta.step_shape).busy_s / corner.busy_s - 1.0

    assert abs(error(StepModel.fit(traces))) < 0.02
    monkeypatch.setattr(step_model, "cross_columns", lambda *args, **kwargs: ())  # least residual alone
    assert error(StepModel.fit(traces)) > 0.05


def _first_seen(trace: Trace, kernel: int, gap_s: float) -> Trace:
    """``trace`` as a step that ran its shape for the first time: one-time host set-up before ``kernel``."""
    kernels = list(trace.kernels)
    kernels[kernel] = replace(kernels[kernel], gap_before_s=gap_s)
    return Trace(replace(trace.meta, measurements={"profiled_first_seen": 1.0}), tuple(kernels))


def test_a_first_seen_steps_one_time_gap_is_not_predicted_into_warm_steps(base: Trace) -> None:
    """A first-seen step among warm ones keeps its kernels but not its one-time gap (capped at the warm steps'
    gap of the same kernel); where every step is first-seen (a packed run) the gaps stay."""
    seqs, kernel, set_up_s = (128, 256, 512, 1024), 40, 0.07
    truth = {seq: _linear(base, seq) for seq in (*seqs, 384)}
    traces = [truth[seq] if seq != 256 else _first_seen(truth[seq], kernel, set_up_s) for seq in seqs]
    predicted = StepModel.fit(traces).predict(StepShape.of([(BATCH, 384)]))
    assert predicted.gap_before_s[kernel] < 2 * truth[384].gap_before_s[kernel] < 1e-3
    mixed = StepModel.fit(traces).predict(StepShape.of([(BATCH, 256)]))
    assert mixed.duration_s.tolist() == truth[256].duration_s.tolist()
    assert mixed.gap_before_s[kernel] == max(truth[seq].gap_before_s[kernel] for seq in (128, 512, 1024))
    shuffled = traces[::-1]  # the capture's check: an error per trace, in its order, the first-seen one included
    assert [error.shape for error in leave_one_out(shuffled)] == [t.meta.step_shape for t in shuffled]
    every = [_first_seen(truth[seq], kernel, set_up_s) for seq in seqs]
    assert StepModel.fit(every).predict(StepShape.of([(BATCH, 384)])).gap_before_s[kernel] == pytest.approx(set_up_s)


def test_a_model_fits_only_the_templates_its_predictions_need(base: Trace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A leave-one-out check or the prediction margin asks each model about one shape: one template fitted, once
    (a capture of nine shapes held the training process for tens of seconds fitting all of them)."""
    fitted: list[int] = []
    template = step_model._template

    def counted(*args: Any) -> step_model.Template:
        fitted.append(args[4])
        return template(*args)

    monkeypatch.setattr(step_model, "_template", counted)
    model = StepModel.fit([_linear(base, seq) for seq in (128, 256, 512, 1024)])
    assert fitted == []
    model.predict(StepShape.of([(BATCH, 384)]))
    model.predict(StepShape.of([(BATCH, 400)]))
    model.predict(StepShape.of([(BATCH, 512)]))  # a captured shape is its own trace
    assert fitted == [model.nearest(StepShape.of([(BATCH, 384)]))]
