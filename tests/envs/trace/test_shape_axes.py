"""What varies between one model's step shapes: length classes and variables, for a decoder, an encoder-decoder,
gradient accumulation and packing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kdvfs.envs.model.step.shape_fit import SCORES_UNIT, Terms, basis, columns, odd_lengths
from kdvfs.envs.trace.shape import ShapeAxes, StepShape


def decoder(seq: int, batch: int = 8) -> StepShape:
    return StepShape.of([(batch, seq)] * 3)


def encoder_decoder(source: int, target: int) -> StepShape:
    """``attention_mask``, ``decoder_input_ids``, ``input_ids``, ``labels`` and the Trainer's scalar."""
    return StepShape.of([(8, source), (8, target), (8, source), (8, target), ()])


def test_a_decoder_has_one_variable_its_tokens() -> None:
    axes = ShapeAxes.of([decoder(100), decoder(300), decoder(300, batch=4)])
    assert axes.variables == (0,) and axes.values(decoder(200)) == (1600,)
    assert axes.length_values(decoder(200)) == (200,)
    assert axes.exact == (True, False)  # the batch is kept exact, the sequence length rounded
    assert axes.size(decoder(200)) == decoder(200).tokens


def test_one_shape_keys_its_first_input_as_before() -> None:
    axes = ShapeAxes.of([decoder(128)])
    assert axes.classes == () and axes.values(decoder(256)) == (2048,) and axes.length_values(decoder(256)) == (256,)


def test_an_encoder_decoder_has_its_input_and_label_tokens() -> None:
    shapes = [encoder_decoder(s, t) for s, t in ((100, 20), (200, 30), (300, 20), (150, 150))]
    axes = ShapeAxes.of(shapes)
    assert axes.classes == (((0, 1), (2, 1)), ((1, 1), (3, 1))) and axes.variables == (0, 1)
    assert axes.values(encoder_decoder(64, 16)) == (512, 128) and axes.class_values(encoder_decoder(64, 16)) == (64, 16)
    assert axes.with_classes(encoder_decoder(64, 16), (80, 32)) == encoder_decoder(80, 32)


def test_micro_batches_of_a_step_each_have_their_own_length() -> None:
    steps = [StepShape.of([(8, a)] * 3 + [(8, b)] * 3) for a, b in ((100, 200), (300, 100), (50, 50))]
    axes = ShapeAxes.of(steps)
    assert axes.variables == (0, 3) and axes.values(steps[0]) == (800, 1600)


def test_a_packed_batch_has_its_tokens_and_its_sequence_count() -> None:
    """``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``: ``cu_seq_lens_k``, ``cu_seq_lens_q``,
    ``input_ids``, ``labels``, ``position_ids``."""
    def packed(count: int, total: int) -> StepShape:
        return StepShape.of([(count + 1,), (count + 1,), (1, total), (1, total), (1, total)])

    axes = ShapeAxes.of([packed(8, 2000), packed(7, 1500), packed(8, 1800)])
    assert axes.variables == (0, 2) and axes.values(packed(5, 900)) == (6, 900) and axes.exact == (False, False)
    assert axes.length_values(packed(5, 900)) == (1, 900)


def test_a_packed_batchs_longest_sequence_is_a_variable_of_its_own() -> None:
    """Offsets at a fixed sequence count, tokens, the longest length (``max_length_k``, ``max_length_q``): the
    quadratic basis crosses tokens with the longest length, the bound of the attention work."""
    def packed(total: int, longest: int) -> StepShape:
        return StepShape.of([(9,), (9,), (1, total), (1, longest), (1, longest), (1, total)])

    shapes = [packed(2000, 700), packed(1500, 300), packed(1800, 900)]
    axes = ShapeAxes.of(shapes)
    assert axes.variables == (2, 3) and axes.values(packed(900, 200)) == (900, 200)
    x = basis([packed(900, 200)], True, axes, Terms.QUADRATIC)[0]
    assert 900 * 200 / SCORES_UNIT in x.tolist()


def test_attention_gets_an_odd_length_column_where_the_captures_have_both_parities() -> None:
    """cuDNN's masked attention runs longer per score on odd lengths: a column that is the score where the
    length is odd, only where the shapes show both parities and determine the wider basis."""
    even = [decoder(s) for s in (128, 256, 512, 768, 1024)]
    axes = ShapeAxes.of(even)
    assert odd_lengths(even, axes, Terms.QUADRATIC) == ()  # one parity: nothing to tell apart
    mixed = [*even, decoder(301)]
    axes = ShapeAxes.of(mixed)
    odd = odd_lengths(mixed, axes, Terms.QUADRATIC)
    assert odd == (0,) and columns(axes, Terms.QUADRATIC, True, odd) == 4
    assert columns(axes, Terms.QUADRATIC, False, odd) == 3  # other kernels: no odd column
    assert basis([decoder(301)], True, axes, Terms.QUADRATIC, odd)[0, -1] == 8 * 301 * 301 / SCORES_UNIT
    assert basis([decoder(300)], True, axes, Terms.QUADRATIC, odd)[0, -1] == 0.0
    assert odd_lengths(mixed[-3:], ShapeAxes.of(mixed[-3:]), Terms.QUADRATIC) == ()  # 3 shapes, 4 columns


@given(st.lists(st.tuples(st.integers(1, 2048), st.integers(1, 2048)), min_size=2, max_size=12))
def test_values_and_classes_round_trip(lengths: list[tuple[int, int]]) -> None:
    shapes = [encoder_decoder(s, t) for s, t in lengths]
    axes = ShapeAxes.of(shapes)
    for shape in shapes:
        assert axes.with_classes(shape, axes.class_values(shape)) == shape
        assert axes.size(shape) == sum(axes.values(shape)) and all(v >= 0 for v in axes.values(shape))
