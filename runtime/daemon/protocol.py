"""The daemon's wire format: one JSON object per line over a Unix stream socket, one reply per request.

Requests name an ``op`` (``lease``, ``lock``, ``reset``, ``state``) and a ``gpu`` (the NVML index); clocks
are in MHz. ``lock`` and ``reset`` need the GPU leased by the same connection. A refused or failed request
is answered ``{"ok": false, "kind": K, "error": "one line"}``, ``K`` naming the error class the client
raises (:data:`ERROR_KINDS`), and the connection stays usable; a line that is not a JSON object is refused
the same way; one longer than :data:`MAX_LINE_BYTES` is refused and ends the connection. Every request's
fields and reply: ``docs/design/device-safety.md`` (Wire format).
"""

from __future__ import annotations

import json
from typing import Any

from kdvfs.runtime.device.errors import (
    ClockRestoreError,
    DeviceError,
    DeviceIndexError,
    NvmlPermissionError,
    UnsupportedClockError,
)
from kdvfs.runtime.device.lease import LeaseHeldError

MAX_LINE_BYTES = 4096
"""The longest request line the daemon reads (a request is well under 200 bytes)."""
OPS = ("lease", "lock", "reset", "state")
"""Every request the daemon accepts; anything else is refused."""
ENVIRONMENT_VARIABLE = "KDVFS_DAEMON"
"""Set to the daemon's socket path, it makes ``run``, ``capture``, ``calibrate``, ``reset`` and the callbacks
change clocks through the daemon (as ``--daemon PATH`` does)."""


class DaemonError(DeviceError):
    """The daemon could not be reached, or it answered something that is not a reply."""


class DaemonRequestError(DeviceError):
    """The daemon refused a request it does not accept (an unknown ``op``, a malformed line, no lease)."""


ERROR_KINDS: dict[str, type[DeviceError]] = {kind.__name__: kind for kind in (
    DeviceError, DeviceIndexError, UnsupportedClockError, ClockRestoreError, NvmlPermissionError, LeaseHeldError,
    DaemonRequestError)}
"""The error classes a refusal may name; any other kind becomes a :class:`DeviceError`."""


def encode(message: dict[str, Any]) -> bytes:
    """One message as its line (UTF-8 JSON and ``\\n``)."""
    return json.dumps(message, separators=(",", ":")).encode("utf-8") + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """The JSON object of one line; :class:`DaemonRequestError` when it is too long or not an object."""
    if len(line) > MAX_LINE_BYTES:
        raise DaemonRequestError(f"a request line is at most {MAX_LINE_BYTES} bytes")
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, a number too long, nesting too deep
        raise DaemonRequestError("a request is one JSON object per line, e.g. {\"op\": \"state\", \"gpu\": 0}") \
            from None
    if not isinstance(message, dict):
        raise DaemonRequestError("a request is one JSON object per line, e.g. {\"op\": \"state\", \"gpu\": 0}")
    return message


def shown(value: object) -> object:
    """A request's field as a log record or a message shows it: None, a boolean, a number below 10**18 or a
    string's first 40 characters as they are, anything else by its kind (a field may be nested thousands deep)."""
    if value is None or isinstance(value, bool | float) or (isinstance(value, int) and abs(value) < 10 ** 18):
        return value
    if isinstance(value, int):
        return "a huge number"
    if isinstance(value, str):
        return value[:40]
    return f"a JSON {type(value).__name__}"


def refusal(error: BaseException) -> dict[str, Any]:
    """The reply refusing a request with ``error`` (its class name as ``kind``, its message on one line)."""
    kind = type(error).__name__ if type(error).__name__ in ERROR_KINDS else DeviceError.__name__
    return {"ok": False, "kind": kind, "error": " ".join(str(error).split())}


def raise_refusal(reply: dict[str, Any]) -> None:
    """Raise the error a refusal names (:data:`ERROR_KINDS`); nothing for a reply with ``"ok": true``."""
    if reply.get("ok") is True:
        return
    kind = ERROR_KINDS.get(str(reply.get("kind")), DeviceError)
    raise kind(str(reply.get("error", "the kdvfs daemon refused the request without a reason")))
