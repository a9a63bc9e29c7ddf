"""The evidence ranges rest on is derived from the data, not typed: the shipped file is reproduced."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kdvfs.envs.calibration.residuals import FIGURES, capture_residuals, real_captures, unknown_share
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.model_error import MODEL_ERROR_PATH
from kdvfs.envs.trace.bundled import open_trace


def test_captures_without_counters_or_ops_for_most_of_their_time_are_left_out() -> None:
    assert unknown_share(open_trace("h200/gpt3xl-1layer-b4")) > 0.5  # kernel events only, its GEMMs unmatched
    assert unknown_share(open_trace("h200/capture-gpt2s-b16")) == 0.0


@pytest.mark.slow
def test_the_shipped_level_residuals_are_those_of_the_bundled_captures() -> None:
    profile = load_profile("h200")
    captures = real_captures(profile)
    names = [name for name, _ in captures]
    assert "h200/gpt3xl-1layer-b4" not in names and len(names) == 24
    fresh = capture_residuals(profile, captures)
    shipped = json.loads(MODEL_ERROR_PATH.read_text())["level"]["h200"]
    assert shipped["labels"] == names
    for figure in FIGURES:
        assert np.allclose(shipped["figures"][figure], fresh.values[figure], atol=2e-5)
