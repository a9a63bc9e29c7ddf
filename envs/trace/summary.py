"""Summaries of a trace: counts, time by category and by phase. Shared by the CLI and the demo."""

from __future__ import annotations

from typing import Any

from kdvfs.envs.trace.trace import Category, Kind, Phase, Trace


def _time_by(trace: Trace, attribute: str, values: type[Category] | type[Phase]) -> dict[str, dict[str, float]]:
    table = {}
    for value in values:
        selected = [k for k in trace.kernels if getattr(k, attribute) is value]
        if selected:
            busy = sum(k.duration_s for k in selected)
            table[value.value] = {"kernels": len(selected), "time_s": busy, "share": busy / trace.busy_s}
    return table


def summarize(trace: Trace) -> dict[str, Any]:
    """A JSON-ready summary of one training step (times in seconds, shares as fractions of kernel time)."""
    meta = trace.meta
    return {
        "workload": meta.workload,
        "gpu": meta.gpu,
        "source": meta.source,
        "activities_per_step": len(trace),
        "kernels_per_step": trace.count(Kind.KERNEL),
        "memsets_per_step": trace.count(Kind.MEMSET),
        "memcpys_per_step": trace.count(Kind.MEMCPY),
        "step_time_s": trace.step_time_s,
        "busy_s": trace.busy_s,
        "idle_s": float(trace.gap_before_s.sum()),
        "kernels_with_features": int(trace.has_features.sum()),
        "median_kernel_s": float(sorted(trace.duration_s)[len(trace) // 2]),
        "measurements": dict(meta.measurements),
        "by_category": _time_by(trace, "category", Category),
        "by_phase": _time_by(trace, "phase", Phase),
    }
