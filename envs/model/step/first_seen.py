"""Captured steps that ran a shape new to the process, without their one-time host set-up: :func:`warm_gaps`.

A step whose forward calls include a shape the process had not run before pays one-time host work (an attention
plan built, memory allocated, a kernel chosen): idle gaps of tens of milliseconds before some kernels, which the
shape's later steps do not have. ``kdvfs capture`` marks such a step's trace (``meta.measurements``
``profiled_first_seen`` 1.0, :class:`~kdvfs.runtime.capture.shape_rounds.ShapeRounds`). A step model that mixed
them with warm steps would predict those gaps, scaled, into every step near them, and a latency-aware plan lowers
its clocks in a predicted gap: on a warm step, where the gap is not, the low clock holds over work. So where some
captured steps are warm, each first-seen step's idle gaps are capped, kernel by kernel, at the longest gap its
aligned partners in the warm steps show (a kernel no warm step matches keeps its gap). Where none is warm
(a packed run: every step a new shape), the gaps stay: the run's steps pay them too. Gaps only shrink; seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.envs.trace.trace import Trace

FIRST_SEEN_KEY = "profiled_first_seen"
"""The measurement that marks a trace whose profiled step ran a shape new to the process (1.0)."""


def is_first_seen(trace: Trace) -> bool:
    """Whether ``trace``'s step ran a forward call of a shape new to the process (a trace that does not say: no)."""
    return bool(trace.meta.measurements.get(FIRST_SEEN_KEY, 0.0))


def warm_gaps(traces: Sequence[Trace], matches: Sequence[Sequence[Array | None]]) -> list[Trace]:
    """``traces`` with each first-seen one's gaps capped at its warm partners' longest (module docstring);
    ``matches[t][j]``: for each kernel of trace t its partner in trace j (-1: none). Traces unchanged where all
    or none are first-seen."""
    warm = [j for j, trace in enumerate(traces) if not is_first_seen(trace)]
    if len(warm) in (0, len(traces)):
        return list(traces)
    warmed = list(traces)
    for t, trace in enumerate(traces):
        if t in warm:
            continue
        gaps_s = trace.gap_before_s
        cap_s = np.full(len(trace), -np.inf)
        for j in warm:
            partner = matches[t][j]
            assert partner is not None
            found = partner >= 0
            cap_s[found] = np.maximum(cap_s[found], traces[j].gap_before_s[partner[found]])
        capped_s = np.where(np.isfinite(cap_s), np.minimum(gaps_s, cap_s), gaps_s)
        warmed[t] = replace(trace, kernels=tuple(
            replace(kernel, gap_before_s=float(gap_s)) if gap_s != kernel.gap_before_s else kernel
            for kernel, gap_s in zip(trace.kernels, capped_s, strict=True)))
    return warmed
