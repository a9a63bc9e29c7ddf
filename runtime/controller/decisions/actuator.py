"""Clock requests to the device, or (dry run) only to the event log."""

from __future__ import annotations

import threading
from typing import Any

from kdvfs.runtime.controller.decisions.decision_records import quantiles
from kdvfs.runtime.controller.event_log import EventLog
from kdvfs.runtime.controller.model.run_summary import RequestFigures
from kdvfs.runtime.device.errors import DeviceError
from kdvfs.runtime.device.host_time import Clock
from kdvfs.runtime.device.interface import Device

LATE_TOLERANCE_S = 1e-6
"""A request that went out this little less than a latency ahead of its change is on time (float rounding)."""


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

    Timeliness (:meth:`figures`): a request planned ahead of its change (its record's ``due_s`` after its
    ``request_s``) is late when it went out less than ``latency_s`` before ``due_s`` (the change then lands
    after it); its lateness is by how much.
    """

    def __init__(self, device: Device | None, dry_run: bool, default_mem_mhz: int, log: EventLog,
                 clock: Clock, latency_s: float = 0.0) -> None:
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
        self.latency_s = latency_s
        self.planned = 0
        """Requests planned ahead of their change."""
        self.late_s: list[float] = []
        """Of them, how late each late one went out (s)."""

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
        due_s, request_s = record.get("due_s"), record.get("request_s")
        if due_s is not None and request_s is not None and due_s > request_s:
            self.planned += 1
            if due_s - issued_s < self.latency_s - LATE_TOLERANCE_S:
                self.late_s.append(self.latency_s - (due_s - issued_s))
        self.log.append("request", clocks=clocks, issued_s=issued_s, dry_run=self.dry_run, **record)
        return True

    def figures(self) -> RequestFigures:
        """For the summary: the requests planned ahead of their change, the late ones among them, their share
        and their lateness (s quantiles)."""
        return RequestFigures(self.planned, len(self.late_s), len(self.late_s) / self.planned if self.planned else None,
                              quantiles(self.late_s))

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
