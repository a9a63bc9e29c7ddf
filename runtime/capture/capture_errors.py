"""Errors of a capture: the recording failed, or the user's script exited before the capture completed."""

from __future__ import annotations

from kdvfs.common.errors import KdvfsError


class CaptureError(KdvfsError):
    """The capture could not record a complete training step (nothing was written)."""


class ScriptExitError(KdvfsError):
    """The user's script exited with a non-zero code before the capture completed; ``exit_code`` is its code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class CaptureStop(BaseException):
    """Raised from the optimizer hook to end the user's script once the capture completed or failed.

    A ``BaseException`` so that the script's own ``except Exception`` cannot swallow it. ``error`` is the
    failure, None when the capture completed.
    """

    def __init__(self, error: KdvfsError | None = None) -> None:
        super().__init__(str(error) if error else "capture complete")
        self.error = error
