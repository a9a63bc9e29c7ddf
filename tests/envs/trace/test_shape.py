"""Step shapes: their variables, labels, JSON form, and their round trip through the trace format."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kdvfs.common.errors import TraceFormatError
from kdvfs.envs.trace.format import dumps_trace, loads_trace
from kdvfs.envs.trace.shape import StepShape, call_shape
from kdvfs.envs.trace.trace import Category, Kernel, Kind, Phase, Trace, TraceMeta

shapes = st.lists(st.lists(st.integers(0, 4096), max_size=4).map(tuple), max_size=4).map(
    lambda dims: StepShape(tuple(dims)))


def test_variables_of_token_ids_and_images() -> None:
    tokens = StepShape.of([(8, 512), (8, 512)])
    assert (tokens.batch, tokens.seq, tokens.tokens, tokens.key) == (8, 512, 4096, "8x512+8x512")
    images = StepShape.of([(32, 3, 224, 224)])
    assert (images.batch, images.seq, images.tokens, images.elements) == (32, 1, 32, 32 * 3 * 224 * 224)
    assert StepShape(()).key == "-" and StepShape(()).tokens == 1


def test_call_shape_reads_tensors_positional_then_by_keyword_name() -> None:
    ids, mask = torch.zeros(4, 7, dtype=torch.long), torch.ones(4, 7)
    shape = call_shape((ids,), {"labels": torch.zeros(4, 7), "attention_mask": mask, "return_dict": True})
    assert shape == StepShape.of([(4, 7), (4, 7), (4, 7)])
    assert call_shape((), {"x": np.zeros((2, 3))}).inputs == ((2, 3),)


def test_a_packed_batchs_longest_length_is_a_one_row_sequence() -> None:
    """The flash-attention keywords of ``DataCollatorWithFlattening``: offsets (tensors) and the longest
    sequence (a plain integer); other integers stay out."""
    offsets, ids = torch.tensor([0, 3, 10]), torch.zeros(1, 10, dtype=torch.long)
    shape = call_shape((), {"cu_seq_lens_q": offsets, "input_ids": ids, "max_length_q": 7, "max_length_k": 7,
                            "num_items_in_batch": 10, "use_cache": False})
    assert shape == StepShape.of([(3,), (1, 10), (1, 7), (1, 7)])
    assert call_shape((), {"max_length_q": True}).inputs == ()


@given(shapes)
def test_json_round_trip(shape: StepShape) -> None:
    assert StepShape.from_json(shape.to_json()) == shape


@pytest.mark.parametrize("value", [[[1.5]], [[-1]], [1, 2], "8x512", [[True]]])
def test_bad_json_is_a_format_error(value: object) -> None:
    with pytest.raises(TraceFormatError):
        StepShape.from_json(value)


def _trace(**meta: object) -> Trace:
    kernel = Kernel(name="k", kind=Kind.KERNEL, category=Category.GEMM, phase=Phase.FORWARD, duration_s=1e-3,
                    gap_before_s=0.0)
    return Trace(meta=TraceMeta(gpu="NVIDIA H200", workload="w", source="test", **meta), kernels=(kernel,))


def test_trace_meta_round_trip_and_old_files_unchanged() -> None:
    plain = _trace()
    assert "step_shape" not in dumps_trace(plain)
    shaped = _trace(step_shape=StepShape.of([(8, 512)]),
                    shape_distribution=((StepShape.of([(8, 512)]), 30), (StepShape.of([(8, 64)]), 2)))
    again = loads_trace(dumps_trace(shaped))
    assert again.meta == shaped.meta
    with pytest.raises(TraceFormatError):
        loads_trace(dumps_trace(shaped).replace('"steps": 30', '"steps": "30"'))
    assert dataclasses.replace(plain.meta, step_shape=None) == loads_trace(dumps_trace(plain)).meta
