"""What every controller shares as a context manager: open on entry (everything opened so far closed again when
opening fails), close on exit and at the interpreter's exit, whichever comes first.

:class:`Managed` is the base of :class:`~kdvfs.runtime.controller.controller.Controller` and
:class:`~kdvfs.runtime.controller.training.own_process.ProcessController`: each gives ``_open`` (what it opens is
closed by its ``_stack``) and ``close`` (idempotent; it unregisters itself from ``atexit``). A SIGTERM on the main
thread raises ``SystemExit`` once ``_open`` called :meth:`Managed._exit_on_sigterm`, and waits for the close's end
once ``close`` called :meth:`Managed._hold_sigterm` (a shutdown is not cut short).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import types
from typing import Self

from kdvfs.runtime.device.nvml_device import Termination, terminate_on_sigterm


class Managed:
    """See the module docstring."""

    _stack: contextlib.ExitStack
    _termination: Termination | None = None

    def _exit_on_sigterm(self) -> None:
        """From now until ``_stack`` closes, SIGTERM raises ``SystemExit`` (on the main thread; elsewhere nothing)."""
        if threading.current_thread() is threading.main_thread():
            self._termination = self._stack.enter_context(terminate_on_sigterm())

    def _hold_sigterm(self) -> None:
        """A close's first act: a SIGTERM from now on waits for the close's end (:meth:`Termination.hold`)."""
        if self._termination is not None:
            self._termination.hold()

    def _open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self._open()
        except BaseException:
            self._stack.close()
            raise
        atexit.register(self.close)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: types.TracebackType | None) -> None:
        self.close()
