"""The board: where the training process's marks and anchors are recorded and the times the GPU passed them are
written, one fixed layout of counters and rings in one buffer.

Writers: the recorder (:mod:`.recorder`, training threads) writes each mark's and anchor's event handle and host
time, then counts it (``ANCHORS`` / ``MARKS``); the poller (:mod:`.poller`, a native thread there) writes, in stream
order, the GPU time each was passed (s since the ``ORIGIN`` event) and, for marks, the host time it saw it and its
step's duration, then counts it (``*_PASSED``). Readers (``gpu_timeline.BoardTimeline``) read a count, then what it
counts. Anchor ``n`` (from 0) lives in slot ``n % ANCHOR_SLOTS``, mark ``i`` (step ``i``'s end) in ``i % MARK_SLOTS``;
a mark's ``anchors`` counts the anchors before it: step ``i``'s are ``[anchors of mark i - 1, anchors of mark i)``.

The buffer is an anonymous mapping, the process's own (:meth:`EventBoard.local`) or a ``memfd`` a controller in a
process of its own maps too (:meth:`EventBoard.shared`, :meth:`EventBoard.attach`). Invariants: a count is written
after what it counts, and stores become visible to another thread or process in the order they were made (x86-64);
the recorder never re-records a slot the poller has not passed.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

ANCHOR_SLOTS = 8192
MARK_SLOTS = 128
ANCHORS, MARKS, ANCHORS_PASSED, MARKS_PASSED, ORIGIN, STOP, POLLS, BLOCKS = range(8)
"""Indices of the board's integers: anchors and marks recorded, passed (seen by the poller), the origin event's
handle (0: not recorded yet), the poller's stop flag and its polls, and the anchor hooks' top-level blocks (for a
controller in a process of its own)."""
HOOK_S, POLLER_CPU_S, SERVER_CPU_S = range(3)
"""Indices of the board's floats: the recorder's CPU (s, :mod:`.recorder`), the poller thread's CPU and the shape
server's (s)."""
_LAYOUT: tuple[tuple[str, Any, int], ...] = (
    ("ints", np.int64, 8), ("floats", np.float64, 4),
    ("anchor_handle", np.uint64, ANCHOR_SLOTS), ("anchor_hook_s", np.float64, ANCHOR_SLOTS),
    ("anchor_gpu_s", np.float64, ANCHOR_SLOTS),
    ("mark_handle", np.uint64, MARK_SLOTS), ("mark_anchors", np.int64, MARK_SLOTS),
    ("mark_signature", np.int64, MARK_SLOTS), ("mark_gpu_s", np.float64, MARK_SLOTS),
    ("mark_seen_s", np.float64, MARK_SLOTS), ("mark_duration_s", np.float64, MARK_SLOTS))
SIZE_BYTES = sum(np.dtype(dtype).itemsize * count for _, dtype, count in _LAYOUT)
NO_SIGNATURE = -1


class EventBoard:
    """The board's arrays (module docstring), views of one mapping: ``ints`` and ``floats`` (the indices above),
    per anchor slot ``anchor_handle`` (its event), ``anchor_hook_s`` (host s its hook ran), ``anchor_gpu_s`` (GPU s
    it was passed), per mark slot ``mark_handle``, ``mark_anchors``, ``mark_signature`` (allocations in its step;
    ``NO_SIGNATURE``: not counted), ``mark_gpu_s``, ``mark_seen_s`` (host s the poller saw it passed) and
    ``mark_duration_s`` (its step's GPU time, s; NaN: not known)."""

    ints: np.ndarray
    floats: np.ndarray
    anchor_handle: np.ndarray
    anchor_hook_s: np.ndarray
    anchor_gpu_s: np.ndarray
    mark_handle: np.ndarray
    mark_anchors: np.ndarray
    mark_signature: np.ndarray
    mark_gpu_s: np.ndarray
    mark_seen_s: np.ndarray
    mark_duration_s: np.ndarray

    def __init__(self, mapping: mmap.mmap, fd: int | None = None) -> None:
        self._mapping = mapping
        self.fd = fd
        """The ``memfd`` behind a shared board, until :meth:`close_fd` (None: a local board)."""
        offset = 0
        for name, dtype, count in _LAYOUT:
            setattr(self, name, np.frombuffer(mapping, dtype=dtype, count=count, offset=offset))
            offset += np.dtype(dtype).itemsize * count

    @classmethod
    def local(cls) -> EventBoard:
        """A board for one process (zeroed; private: a forked child's writes stay its own)."""
        return cls(mmap.mmap(-1, SIZE_BYTES, flags=mmap.MAP_PRIVATE))

    @classmethod
    def shared(cls) -> EventBoard:
        """A board another process can map (zeroed): pass :attr:`fd` to it (``pass_fds``), then :meth:`close_fd`."""
        fd = os.memfd_create("kdvfs-timeline", os.MFD_CLOEXEC)
        os.ftruncate(fd, SIZE_BYTES)
        return cls(mmap.mmap(fd, SIZE_BYTES), fd)

    @classmethod
    def attach(cls, fd: int) -> EventBoard:
        """The board behind ``fd`` (a :meth:`shared` board's, inherited), which is closed once mapped."""
        try:
            return cls(mmap.mmap(fd, SIZE_BYTES))
        finally:
            os.close(fd)

    def close_fd(self) -> None:
        """Close the ``memfd`` (the mapping stays; idempotent)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
