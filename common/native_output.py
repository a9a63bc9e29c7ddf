"""Keep native libraries' prints off standard output: a solver's C++ code writes to file descriptor 1 directly,
past ``sys.stdout``, and would break a command whose stdout must hold one JSON document."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STDOUT_FD = 1
STDERR_FD = 2
_lock = threading.Lock()
_depth = 0
_saved_fd: int | None = None


def _enter() -> None:
    global _depth, _saved_fd
    with _lock:
        _depth += 1
        if _depth > 1:
            return
        sys.stdout.flush()
        try:
            _saved_fd = os.dup(STDOUT_FD)
            os.dup2(STDERR_FD, STDOUT_FD)
        except OSError:  # no descriptor 1 or 2 to move: nothing native can print there either
            _saved_fd = None


def _leave() -> None:
    global _depth, _saved_fd
    with _lock:
        _depth -= 1
        if _depth > 0 or _saved_fd is None:
            return
        sys.stderr.flush()
        os.dup2(_saved_fd, STDOUT_FD)
        os.close(_saved_fd)
        _saved_fd = None


@contextmanager
def native_stdout_to_stderr() -> Iterator[None]:
    """Inside, whatever is written to file descriptor 1 (native code included) goes to standard error; Python's
    ``sys.stdout`` is flushed on entry so nothing printed before moves. Nests and is safe across threads: the
    outermost entry moves the descriptor and the last exit puts it back."""
    _enter()
    try:
        yield
    finally:
        _leave()
