"""The traces bundled with kdvfs under ``data/traces/<gpu>/<workload>.trace.json``."""

from __future__ import annotations

from pathlib import Path

from kdvfs.envs.common.errors import TraceFormatError
from kdvfs.envs.common.paths import BUNDLED_TRACE_DIR
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.trace import Trace

SUFFIX = ".trace.json"
DEFAULT_TRACE = "h200/gpt3xl-24layer-b4"


def bundled_traces() -> list[str]:
    """Names (``gpu/workload``) of the bundled traces."""
    return sorted(str(p.relative_to(BUNDLED_TRACE_DIR))[: -len(SUFFIX)] for p in BUNDLED_TRACE_DIR.rglob(f"*{SUFFIX}"))


def trace_path(name_or_path: str | Path) -> Path:
    """A trace file path, or the path of a bundled trace named ``gpu/workload``."""
    candidate = Path(name_or_path)
    if candidate.is_file():
        return candidate
    bundled = BUNDLED_TRACE_DIR / f"{name_or_path}{SUFFIX}"
    if bundled.is_file():
        return bundled
    raise TraceFormatError(f"{name_or_path}: no such trace file or bundled trace; bundled: "
                           f"{', '.join(bundled_traces()) or 'none'}")


def open_trace(name_or_path: str | Path) -> Trace:
    """Load a trace from a path or a bundled name."""
    return load_trace(trace_path(name_or_path))
