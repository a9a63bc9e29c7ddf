"""What every controller shares as a context manager: open on entry (everything opened so far closed again when
opening fails), close on exit and at the interpreter's exit, whichever comes first.

:class:`Managed` is the base of :class:`~kdvfs.runtime.controller.controller.Controller` and
:class:`~kdvfs.runtime.controller.training.own_process.ProcessController`: each gives ``_open`` (what it opens is
closed by its ``_stack``) and ``close`` (idempotent; it unregisters itself from ``atexit``).
"""

from __future__ import annotations

import atexit
import contextlib
import types
from typing import Self


class Managed:
    """See the module docstring."""

    _stack: contextlib.ExitStack

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
