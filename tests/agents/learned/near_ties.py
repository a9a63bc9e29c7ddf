"""Telling a near-tie: the float64 logits of two actions, for tests that allow float32 sums in another order."""

from __future__ import annotations

import numpy as np

from kdvfs.agents.learned.policy.frozen import FrozenPolicy


def logit_pair(policy: FrozenPolicy, observation: np.ndarray, a: np.ndarray, b: np.ndarray, part: int
               ) -> tuple[float, float]:
    """The float64 logits of part ``part``'s choices ``a[part]`` and ``b[part]`` on ``observation``."""
    x = np.clip((observation - policy.obs_mean) / np.sqrt(policy.obs_var + policy.obs_epsilon), -policy.obs_clip,
                policy.obs_clip)
    for weight, bias in zip(policy.weights[:-1], policy.biases[:-1], strict=True):
        x = np.tanh(x @ weight + bias) if policy.activation == "tanh" else np.maximum(x @ weight + bias, 0)
    logits = x @ policy.weights[-1] + policy.biases[-1]
    start = sum(policy.nvec[:part])
    return float(logits[start + a[part]]), float(logits[start + b[part]])
