"""The controller's JSONL event log: every request, step, decision and measurement window of a run; written by
:class:`EventLog`, read back by :func:`read_event_log` (``kdvfs report``, the summary of a killed run)."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from kdvfs.common.errors import KdvfsError


class EventLog:
    """JSON lines (``{"event": ..., ...}``) appended to ``path`` (nothing written when None); thread-safe.

    Times are seconds on the controller's host clock (``time.perf_counter`` in a real run), named ``*_s``; a step
    record's arrays of times (its anchors' host times, its pace) are integer nanoseconds, named ``*_ns``
    (:func:`nanoseconds`; an integer's text costs a fraction of a float's shortest form, each step, on the
    controller's thread), read back in seconds with :func:`seconds`.

    Every record is written and flushed to the operating system at once (:meth:`append`, for the clock requests
    and online decisions: with the next, at the latest the step's), so a killed process (SIGKILL) leaves every
    record up to the last flushed one.
    """

    def __init__(self, path: str | Path | None) -> None:
        self._file: IO[str] | None = open(path, "w", encoding="utf-8") if path else None  # noqa: SIM115 (closed by close())
        self._lock = threading.Lock()
        self._pending: list[dict[str, Any] | str] = []

    def write(self, event: str, **fields: Any) -> None:
        if self._file is not None:
            self.write_line(json.dumps({"event": event, **fields}) + "\n")

    def write_line(self, line: str) -> None:
        """:meth:`write` of a record already encoded as its JSON line (with its newline)."""
        if self._file is None:
            return
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


def nanoseconds(times_s: Sequence[float]) -> list[int]:
    """``times_s`` (s) as whole nanoseconds, each rounded to the nearest (what a step record's ``*_ns`` arrays
    hold: the host clock counts nanoseconds, so a real run's times lose nothing)."""
    return [round(t * 1e9) for t in times_s]


def step_line(step: int, end_s: float, duration_s: float | None, signature: int | None, matched: bool,
              controlled: bool, next_controlled: bool, scale: float, arm: str, anchors_ns: list[int],
              pace_ns: list[int] | None, pace_json: str | None = None) -> str:
    """A finished step's record (``{"event": "step", ...}``, these fields in this order) as the JSON line
    ``json.dumps`` writes for it (with its newline; tested), with one f-string: the dict and the encoder's
    general path take the controller's thread longer, each step. ``anchors_ns`` and ``pace_ns`` are
    :func:`nanoseconds`' lists of ints; ``pace_json``: ``pace_ns``'s text (``str(pace_ns)``) where the caller
    kept it from an earlier step with the same pace. A non-finite time or another field of another type is
    encoded by ``json.dumps`` itself."""
    if not (type(step) is int and _finite(end_s) and (duration_s is None or _finite(duration_s))
            and (signature is None or type(signature) is int) and _finite(scale) and type(arm) is str
            and type(anchors_ns) is list and (pace_ns is None or type(pace_ns) is list)):
        return json.dumps({"event": "step", "step": step, "end_s": end_s, "duration_s": duration_s,
                           "signature": signature, "matched": matched, "controlled": controlled,
                           "next_controlled": next_controlled, "scale": scale, "arm": arm, "anchors_ns": anchors_ns,
                           "pace_ns": pace_ns}) + "\n"
    pace_text = "null" if pace_ns is None else _ints(pace_ns) if pace_json is None else pace_json
    return (f'{{"event": "step", "step": {step}, "end_s": {float(end_s)!r}, '
            f'"duration_s": {"null" if duration_s is None else repr(float(duration_s))}, '
            f'"signature": {"null" if signature is None else signature}, "matched": {_BOOLS[matched]}, '
            f'"controlled": {_BOOLS[controlled]}, "next_controlled": {_BOOLS[next_controlled]}, '
            f'"scale": {float(scale)!r}, "arm": {_string(arm)}, "anchors_ns": {_ints(anchors_ns)}, '
            f'"pace_ns": {pace_text}}}\n')


_BOOLS = {True: "true", False: "false"}
_STRINGS: dict[str, str] = {}
"""Strings (the A/B windows' arms) as JSON, each encoded once."""


def _string(text: str) -> str:
    encoded = _STRINGS.get(text)
    if encoded is None:
        encoded = _STRINGS[text] = json.dumps(text)
    return encoded


def _finite(value: float) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def _ints(values: list[int]) -> str:
    """A list of ints (:func:`nanoseconds`') as JSON: Python's text of it is."""
    return str(values)


def seconds(record: dict[str, Any], name: str) -> list[float] | None:
    """A step record's array ``name`` (e.g. ``anchors``, ``pace``) in seconds: its ``{name}_ns`` over 1e9, or
    ``{name}_s`` as a log written before they were nanoseconds holds it; None where the record has null or
    neither."""
    if f"{name}_ns" in record:
        times_ns = record[f"{name}_ns"]
        return None if times_ns is None else [t / 1e9 for t in times_ns]
    return record.get(f"{name}_s")


class EventLogError(KdvfsError):
    """A run's log cannot be read or holds a damaged record before its last line."""


def read_event_log(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The records of a log :class:`EventLog` wrote, and whether its last record was cut off.

    A process killed while writing leaves a last line that is no complete JSON record and does not end in a
    newline: that record is dropped (the second value is then True). Anything else that is not a JSON object
    with an ``event`` is an :class:`EventLogError` naming the file and the line (1-based), as is a file that
    cannot be read.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except IsADirectoryError:
        raise EventLogError(f"{path} is a folder, expected a run log file (`kdvfs run --log`)") from None
    except FileNotFoundError:
        raise EventLogError(f"{path}: no such file; pass the file of `kdvfs run --log`") from None
    except (OSError, UnicodeDecodeError) as error:
        raise EventLogError(f"{path}: not a readable kdvfs run log ({error}); pass the file of `kdvfs run --log`"
                            ) from None
    lines = text.split("\n")
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):  # the last line, without its newline: a record cut off by a kill
                return records, True
            raise EventLogError(f"{path}: line {number}, column {error.colno}: not a JSON record ({error.msg}); "
                                "the log is damaged, or not a kdvfs run log") from None
        if not isinstance(record, dict) or "event" not in record:
            raise EventLogError(f"{path}: line {number}: not a kdvfs run log record (no \"event\")")
        records.append(record)
    return records, False
