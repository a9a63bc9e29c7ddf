"""The CUDA driver's event calls, as function pointers a native (numba ``nopython``) loop can call without the
interpreter lock.

:class:`EventCalls` holds ``cuEventQuery`` (``CUDA_SUCCESS``: the GPU has passed the event; ``CUDA_ERROR_NOT_READY``:
not yet), ``cuEventElapsedTime`` (milliseconds between two passed events, written to a ``float*``) and the calls
that make a thread's CUDA context current. A ``torch.cuda.Event``'s ``cuda_event`` is the driver's ``CUevent``
(runtime events are driver events), so the loop queries torch's events by handle. Tests use
:class:`kdvfs.runtime.testing.fake_cuda_events.FakeCudaEvents`'s calls instead.

Failure modes: no CUDA driver library raises :class:`CudaDriverError` with the fix.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kdvfs.common.errors import KdvfsError

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600
QUERY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64)
"""``CUresult cuEventQuery(CUevent)``."""
ELAPSED = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64)
"""``CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)``."""
LIBRARY = "libcuda.so.1"


class CudaDriverError(KdvfsError):
    """The CUDA driver library could not be loaded."""


@dataclass(frozen=True, eq=False)
class EventCalls:
    """The event calls (``query``: a :data:`QUERY`, ``elapsed``: an :data:`ELAPSED`), and the calling thread's CUDA
    context: ``current_context()`` its handle (0: none), ``set_context(handle)`` makes it the calling thread's.
    Hashed by identity: the poller's loop is compiled once per calls."""

    query: Any
    elapsed: Any
    current_context: Callable[[], int]
    set_context: Callable[[int], None]


def pointer(prototype: Any, function: Any) -> Any:
    """``function`` (a ctypes function or callback) as a ``prototype`` of its address: what a numba ``nopython``
    loop can call."""
    return prototype(ctypes.cast(function, ctypes.c_void_p).value)


@functools.cache
def driver_event_calls() -> EventCalls:
    """The CUDA driver's calls (:data:`LIBRARY`); raises :class:`CudaDriverError` when it is not installed."""
    try:
        cuda = ctypes.CDLL(LIBRARY)
    except OSError as error:
        raise CudaDriverError(f"cannot load the CUDA driver ({LIBRARY}: {error}); install the NVIDIA driver, or "
                              "run with --cpu-test-mode") from error
    get_current, set_current = cuda.cuCtxGetCurrent, cuda.cuCtxSetCurrent
    get_current.argtypes, get_current.restype = [ctypes.POINTER(ctypes.c_void_p)], ctypes.c_int
    set_current.argtypes, set_current.restype = [ctypes.c_void_p], ctypes.c_int

    def current_context() -> int:
        context = ctypes.c_void_p()
        return int(context.value or 0) if get_current(ctypes.byref(context)) == CUDA_SUCCESS else 0

    def set_context(handle: int) -> None:
        set_current(ctypes.c_void_p(handle))

    return EventCalls(pointer(QUERY, cuda.cuEventQuery), pointer(ELAPSED, cuda.cuEventElapsedTime),
                      current_context, set_context)
