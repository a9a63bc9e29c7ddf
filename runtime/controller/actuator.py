"""Clock requests to the device, or (dry run) only to the log; and the controller's JSONL event log."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import IO, Any

from kdvfs.runtime.device.errors import DeviceError
from kdvfs.runtime.device.host_time import Clock
from kdvfs.runtime.device.interface import Device


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


def parse_clocks(label: str) -> tuple[int | None, int]:
    """``"1410:3201"`` -> (1410, 3201); ``"auto:2201"`` -> (None, 2201)."""
    core, mem = label.split(":")
    return (None if core == "auto" else int(float(core))), int(float(mem))


class Actuator:
    """Applies clock labels to ``device`` (never in a dry run), one at a time, skipping repeats.

    Auto at the default memory clock is a reset of both clocks; auto at another memory clock locks only the
    memory clock. After :meth:`close` every request is ignored, so a late request of the controller's thread
    cannot follow the final restore. A restore that fails is kept in ``restore_error`` (``restored`` stays
    False), not raised: whoever closes goes on with the rest of the shutdown.
    """

    def __init__(self, device: Device | None, dry_run: bool, default_mem_mhz: int, log: EventLog,
                 clock: Clock) -> None:
        self.device, self.dry_run, self.log, self.clock = device, dry_run, log, clock
        self.auto = f"auto:{default_mem_mhz}"
        self.default_mem_mhz = default_mem_mhz
        self.current = self.auto
        self.issued_s = 0.0
        self.switches = 0
        self.touched = False
        self.restored = False
        self.restore_error: DeviceError | None = None
        self._closed = False
        self._lock = threading.Lock()

    def _apply(self, clocks: str) -> None:
        if self.dry_run or self.device is None:
            return
        core_mhz, mem_mhz = parse_clocks(clocks)
        self.touched = True
        if core_mhz is None and mem_mhz == self.default_mem_mhz:
            self.device.reset_clocks()
        else:
            self.device.lock_clocks_mhz(core_mhz, mem_mhz)

    def request(self, clocks: str, **record: Any) -> bool:
        """Request ``clocks`` now; ``record`` (step, kernel, due time, ...) goes to the log with its next written
        record (:meth:`EventLog.append`: no JSON encoding or system call after the request on the deciding
        thread). False when it was a repeat or the actuator is closed."""
        with self._lock:
            if self._closed or clocks == self.current:
                return False
            issued_s = self.clock.now_s()
            self._apply(clocks)
            self.current, self.issued_s = clocks, issued_s
            self.switches += 1
        self.log.append("request", clocks=clocks, issued_s=issued_s, dry_run=self.dry_run, **record)
        return True

    def close(self) -> None:
        """Return the clocks to the GPU (when anything was changed) and ignore every later request."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.touched and self.device is not None:
                try:
                    self.device.reset_clocks()
                except DeviceError as error:
                    self.restore_error = error
                    self.log.write("restore_error", message=str(error))
                    return
                self.current = self.auto
            self.restored = True
