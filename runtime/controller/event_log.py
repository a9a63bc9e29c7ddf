"""The controller's JSONL event log: every request, step, decision and measurement window of a run."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import IO, Any


class EventLog:
    """JSON lines (``{"event": ..., ...}``) appended to ``path`` (nothing written when None); thread-safe.

    Every record is written and flushed to the operating system at once (:meth:`append`, for the clock requests
    and online decisions: with the next, at the latest the step's), so a killed process (SIGKILL) leaves every
    record up to the last flushed one. Times are seconds
    on the controller's host clock (``time.perf_counter`` in a real run), named ``*_s``.
    """

    def __init__(self, path: str | Path | None) -> None:
        self._file: IO[str] | None = open(path, "w", encoding="utf-8") if path else None  # noqa: SIM115 (closed by close())
        self._lock = threading.Lock()
        self._pending: list[dict[str, Any] | str] = []

    def write(self, event: str, **fields: Any) -> None:
        if self._file is None:
            return
        line = json.dumps({"event": event, **fields}) + "\n"
        with self._lock:
            self._write_pending()
            if self._file is not None:
                self._file.write(line)
                self._file.flush()

    def append(self, event: str, **fields: Any) -> None:
        """:meth:`write` later: the record is kept as it is and written, in order, with the next :meth:`write`
        or :meth:`close` (for the online decisions, dozens a step: neither their JSON encoding nor a system
        call lies between a decision and its request). ``fields`` must not change afterwards."""
        if self._file is not None:
            with self._lock:
                self._pending.append({"event": event, **fields})

    def append_line(self, line: str) -> None:
        """:meth:`append` of a record already encoded as its JSON line (with its newline)."""
        if self._file is not None:
            with self._lock:
                self._pending.append(line)

    def _write_pending(self) -> None:
        if self._file is not None and self._pending:
            self._file.write("".join(record if isinstance(record, str) else json.dumps(record) + "\n"
                                     for record in self._pending))
        self._pending = []

    def close(self) -> None:
        with self._lock:
            self._write_pending()
            if self._file is not None:
                self._file.close()
                self._file = None
