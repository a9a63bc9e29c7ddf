"""The compiled forward pass against numpy in float64: layers within float32 rounding, the action the same up to
near-ties, for both activations and a split first layer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdvfs.agents.learned.policy.forward import RELU, TANH, act, argmax_parts, dense, first_layer

ACTIVATIONS = {TANH: np.tanh, RELU: lambda x: np.maximum(x, 0.0)}
CLIP = 5.0


def _network(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"w0": (23, 16), "b0": (16,), "w1": (16, 16), "b1": (16,), "w2": (16, 7), "b2": (7,)}
    net = {name: rng.normal(0, 0.5, shape).astype(np.float32) for name, shape in shapes.items()}
    net["mean"] = rng.normal(0, 1, 23).astype(np.float32)
    net["inverse_std"] = rng.uniform(0.2, 3, 23).astype(np.float32)
    net["x"] = rng.normal(0, 4, 23).astype(np.float32)
    return net


def _reference(net: dict[str, np.ndarray], activation: int) -> tuple[np.ndarray, np.ndarray]:
    """Hidden output and logits in float64."""
    act = ACTIVATIONS[activation]
    x = np.clip((net["x"].astype(np.float64) - net["mean"]) * net["inverse_std"], -CLIP, CLIP)
    hidden = act(act(x @ net["w0"] + net["b0"]) @ net["w1"] + net["b1"])
    return hidden, hidden @ net["w2"] + net["b2"]


def _compiled(net: dict[str, np.ndarray], activation: int, split: int) -> tuple[np.ndarray, np.ndarray]:
    """The compiled pass, the first layer split at ``split``: entries before it as the products of two ranges
    (split again at its half), picked from rows among others."""
    x = np.clip((net["x"][:split] - net["mean"][:split]) * net["inverse_std"][:split], -CLIP, CLIP)
    half = split // 2
    parts = [x[:half] @ net["w0"][:half], x[half:] @ net["w0"][half:split]]
    products = np.stack([np.full(16, 99.0), parts[1], np.full(16, -99.0), parts[0]]).astype(np.float32)
    first = first_layer(net["w0"][split:], net["x"][split:], net["mean"][split:], net["inverse_std"][split:], CLIP,
                        products, np.array([3, 1], dtype=np.int64), net["b0"], np.empty(16, dtype=np.float32),
                        activation)
    hidden = dense(net["w1"], first, net["b1"], np.empty(16, dtype=np.float32), activation)
    return hidden, argmax_parts(net["w2"], hidden, net["b2"], np.empty(7, dtype=np.float32),
                                np.array([0, 2, 7], dtype=np.int64))


@pytest.mark.parametrize("activation", [TANH, RELU])
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), split=st.integers(0, 23))
def test_compiled_forward_matches_float64_numpy(activation: int, seed: int, split: int) -> None:
    net = _network(seed)
    hidden, logits = _reference(net, activation)
    compiled_hidden, action = _compiled(net, activation, split)
    assert np.allclose(compiled_hidden, hidden, atol=1e-4)
    for part, (start, stop) in enumerate(((0, 2), (2, 7))):
        assert logits[start + action[part]] >= logits[start:stop].max() - 1e-4, (part, action)


def test_the_first_maximum_wins_a_tie() -> None:
    weight, x = np.zeros((2, 4), dtype=np.float32), np.ones(2, dtype=np.float32)
    bias = np.array([0.0, 3.0, 3.0, 1.0], dtype=np.float32)
    action = argmax_parts(weight, x, bias, np.empty(4, dtype=np.float32), np.array([0, 4], dtype=np.int64))
    assert action.tolist() == [1]


@pytest.mark.parametrize("hidden_layers", [0, 1, 2])
@pytest.mark.parametrize("activation", [TANH, RELU])
def test_one_compiled_call_gives_the_action_of_the_layer_by_layer_pass(hidden_layers: int, activation: int) -> None:
    net, split, bounds = _network(7), 5, np.array([0, 2, 7], dtype=np.int64)
    x = np.clip((net["x"][:split] - net["mean"][:split]) * net["inverse_std"][:split], -CLIP, CLIP)
    product = (x @ net["w0"][:split]).astype(np.float32)
    first = (net["w0"][split:].copy(), net["b0"], np.empty(16, dtype=np.float32))
    hidden = tuple((net["w1"] * (1 + i), net["b1"], np.empty(16, dtype=np.float32)) for i in range(hidden_layers))
    last = (net["w2"], net["b2"], np.empty(7, dtype=np.float32))
    products, picks = np.stack([np.zeros_like(product), product]), np.array([1], dtype=np.int64)
    step = first_layer(first[0], net["x"][split:], net["mean"][split:], net["inverse_std"][split:], CLIP, products,
                       picks, first[1], np.empty(16, dtype=np.float32), activation)
    for weight, bias, _ in hidden:
        step = dense(weight, step, bias, np.empty(16, dtype=np.float32), activation)
    logits = np.empty(7, dtype=np.float32)
    expected = argmax_parts(last[0], step, last[1], logits, bounds)
    action = act(first, net["x"][split:], net["mean"][split:], net["inverse_std"][split:], CLIP, products, picks,
                 (*hidden, last), bounds, activation)
    assert action.tolist() == expected.tolist() and np.array_equal(last[2], logits)  # the same sums, bit for bit


def test_tanh_is_within_2e_7_of_tanh_and_saturates_without_overflow() -> None:
    """The hidden layers' tanh (from ``exp`` in float32) against float64 tanh, through a dense layer of identity
    weights, over [-20, 20], values near 0 and the float32 extremes."""
    x = np.concatenate([np.linspace(-20, 20, 40001), np.geomspace(1e-12, 1e-2, 200), -np.geomspace(1e-12, 1e-2, 200),
                        [np.finfo(np.float32).max, -np.finfo(np.float32).max, 0.0]]).astype(np.float32)
    out, eye = np.empty_like(x), np.eye(512, dtype=np.float32)
    for start in range(0, len(x), 512):
        chunk = x[start:start + 512]
        out[start:start + 512] = dense(eye[:len(chunk), :len(chunk)].copy(), chunk, np.zeros_like(chunk),
                                       np.empty_like(chunk), TANH)
    assert np.abs(out - np.tanh(x.astype(np.float64))).max() <= 2e-7
    assert out[-3] == 1.0 and out[-2] == -1.0 and out[-1] == 0.0
