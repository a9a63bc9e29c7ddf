"""A frozen policy's forward pass, compiled (numba): normalisation, the MLP and each action part's argmax.

:class:`~kdvfs.agents.learned.policy.frozen.FrozenPolicy` runs every action through :func:`act`, one compiled call
(a controller's decision runs on a core that has often just woken: each further call through numba's
dispatcher is more cold code and data on its path). A controller's live decision (``act_from``: the first
layer's share of the observation's static part and of its clock one-hots computed ahead, as rows picked and
added here, the rest multiplied here) is a few microseconds of compiled code on arrays of a few hundred
entries, holding the interpreter lock throughout: shorter than a hand-over of the lock to a busy training
thread and back, which a release (``nogil``) would risk at every call. Sums are float32 in index order, as
the environment's observations are float32; the action agrees with SB3's float32 forward pass up to ties
within float32 rounding.
"""

from __future__ import annotations

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.compiled import compiled

TANH, RELU = 0, 1
"""Activations, by the code the kernels take."""


@compiled
def _activate(value: np.float32, activation: int) -> np.float32:
    """tanh as ``1 - 2 / (exp(2 value) + 1)`` in float32 (within 2e-7 of tanh: ``exp`` takes a quarter of the time
    ``tanh`` takes, and a decision runs 256 of them; it saturates to +-1 without overflow trouble), or relu."""
    if activation == TANH:
        return np.float32(1.0) - np.float32(2.0) / (np.exp(np.float32(2.0) * value) + np.float32(1.0))
    return max(value, np.float32(0.0))


@compiled
def _affine(weight: Array, x: Array, out: Array) -> None:
    """``out`` (O,) = ``x`` (I,) @ ``weight`` (I, O), summed over I in order (the inner loop runs over O, so it
    vectorises without reordering any sum; four rows of ``weight`` a pass, so that ``out`` is loaded and stored a
    quarter as often: the same sums, bit for bit)."""
    out[:] = 0.0
    rows, j = x.shape[0], 0
    while j + 4 <= rows:
        x0, x1, x2, x3 = x[j], x[j + 1], x[j + 2], x[j + 3]
        for o in range(out.shape[0]):
            out[o] = (((out[o] + x0 * weight[j, o]) + x1 * weight[j + 1, o]) + x2 * weight[j + 2, o]) \
                + x3 * weight[j + 3, o]
        j += 4
    for k in range(j, rows):
        for o in range(out.shape[0]):
            out[o] += x[k] * weight[k, o]


@compiled
def first_layer(weight: Array, entries: Array, mean: Array, inverse_std: Array, clip: float, products: Array,
                picks: Array, bias: Array, out: Array, activation: int) -> Array:
    """``out`` (H,) = activation(x @ ``weight`` (R, H) + the rows ``picks`` (n,) of ``products`` (P, H), in that
    order, + ``bias`` (H,)), x the (R,) ``entries`` normalised with ``mean`` and ``inverse_std`` and clipped to
    +-``clip``; returns ``out``."""
    x = np.empty(entries.shape[0], dtype=np.float32)
    limit = np.float32(clip)
    for j in range(entries.shape[0]):
        x[j] = min(max((np.float32(entries[j]) - mean[j]) * inverse_std[j], -limit), limit)
    _affine(weight, x, out)
    for i in range(picks.shape[0]):
        row = picks[i]
        for h in range(out.shape[0]):
            out[h] += products[row, h]
    for h in range(out.shape[0]):
        out[h] = _activate(out[h] + bias[h], activation)
    return out


@compiled
def dense(weight: Array, x: Array, bias: Array, out: Array, activation: int) -> Array:
    """``out`` (H,) = activation(``x`` (I,) @ ``weight`` (I, H) + ``bias``); returns ``out``."""
    _affine(weight, x, out)
    for h in range(out.shape[0]):
        out[h] = _activate(out[h] + bias[h], activation)
    return out


@compiled
def argmax_parts(weight: Array, x: Array, bias: Array, logits: Array, bounds: Array) -> Array:
    """The action: for each part ``bounds[i]:bounds[i + 1]`` of the logits ``x`` @ ``weight`` (I, L) + ``bias``
    (into ``logits`` (L,)), the index of its first maximum, as (parts,) int64."""
    _affine(weight, x, logits)
    action = np.zeros(bounds.shape[0] - 1, dtype=np.int64)
    for part in range(action.shape[0]):
        best = -np.inf
        for index in range(bounds[part], bounds[part + 1]):
            logit = logits[index] + bias[index]
            if logit > best:
                best, action[part] = logit, index - bounds[part]
    return action


@compiled
def act(first: tuple[Array, Array, Array], entries: Array, mean: Array, inverse_std: Array, clip: float,
        products: Array, picks: Array, rest: tuple[tuple[Array, Array, Array], ...], bounds: Array,
        activation: int) -> Array:
    """The action (:func:`argmax_parts`) of the MLP whose layers are (weight (I, O), bias (O,), output buffer (O,))
    triples: ``first`` (its weight's rows those of ``entries``; its input as :func:`first_layer` takes it), then
    ``rest``: the hidden layers and the logits layer last (a non-empty tuple of like-typed triples)."""
    x = first_layer(first[0], entries, mean, inverse_std, clip, products, picks, first[1], first[2], activation)
    for layer in range(len(rest) - 1):
        weight, bias, out = rest[layer]
        x = dense(weight, x, bias, out, activation)
    weight, bias, logits = rest[len(rest) - 1]
    return argmax_parts(weight, x, bias, logits, bounds)
