"""The traces bundled with kdvfs under ``data/traces/<gpu>/<workload>.trace.json``."""

from __future__ import annotations

from pathlib import Path

from kdvfs.common.errors import TraceFormatError
from kdvfs.common.paths import BUNDLED_TRACE_DIR
from kdvfs.common.resolve import resolve_shipped, shipped_names
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.trace import Trace

SUFFIX = ".trace.json"
DEFAULT_TRACE = "h200/gpt3xl-24layer-b4"


def bundled_traces() -> list[str]:
    """Names (``gpu/workload``) of the bundled traces."""
    return shipped_names(BUNDLED_TRACE_DIR, SUFFIX)


def trace_path(name_or_path: str | Path) -> Path:
    """A trace file path, or the path of a bundled trace named ``gpu/workload``."""
    return resolve_shipped(name_or_path, BUNDLED_TRACE_DIR, SUFFIX, "trace", error=TraceFormatError)


def open_trace(name_or_path: str | Path) -> Trace:
    """Load a trace from a path or a bundled name."""
    return load_trace(trace_path(name_or_path))
