"""The controller's step timeline alone, as the with-arm of the controller benchmark's windows (``probe=KIND``).

Where a whole controller slows a training step, this measures how much of that its measuring floor costs, with
none of kdvfs's deciding, logging, NVML, energy reads or anchors:

* ``mark``: each step hook records the step's CUDA event and reads the allocator's count
  (:meth:`~kdvfs.runtime.controller.gpu_timeline.CudaStepTimeline.mark`); nothing waits for them;
* ``blocking``: the same, and a thread that blocks in ``Event.synchronize`` on each step's (blocking-sync)
  event, then reads the step's end (:meth:`~kdvfs.runtime.controller.gpu_timeline.CudaStepTimeline.wait`),
  as the controller's thread did before it polled;
* ``polling``: the thread waits as the controller's thread does since
  (:meth:`~kdvfs.runtime.controller.gpu_timeline.CudaStepTimeline.wait`: ``Event.query`` every
  ``gpu_timeline.POLL_S``, sleeping in between);
* ``anchors``: ``polling``, and the controller's anchor hooks (:class:`~kdvfs.runtime.controller.anchors.AnchorHooks`)
  recording their events into the timeline: what a training process would still do for a controller whose
  deciding ran in a process of its own;
* ``gil:WAKESxUS`` (e.g. ``gil:25x200``): ``polling``, and after each step's end the thread wakes WAKES times,
  evenly through the next step's expected time (the last step's), and each time runs pure Python for US
  microseconds, holding the interpreter lock as a decision point's Python does: what a millisecond of the
  controller thread's Python per step costs a training loop bound by its own.

The run of 2026-12-02 (``benchmarks/results/controller_online_hf_probe_h200.md``) was of the code before the
controller polled: its ``blocking`` was the timeline's own wait then, its ``polling`` this module's loop at
the same 1 ms.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from typing import Any

from kdvfs.runtime.controller.anchors import AnchorHooks
from kdvfs.runtime.controller.gpu_timeline import CudaStepTimeline
from kdvfs.runtime.device.host_time import RealClock

WAITS = ("mark", "blocking", "polling", "anchors")
KINDS = (*WAITS, "gil:WAKESxUS")
GIL = re.compile(r"gil:(\d+)x(\d+)")


class TimelineProbe:
    """Used as the harness uses a controller: enter, ``step()`` at every step hook, ``close()`` (or exit);
    no summary."""

    def __init__(self, kind: str) -> None:
        gil = GIL.fullmatch(kind)
        if kind not in WAITS and gil is None:
            raise SystemExit(f"probe={kind!r}: expected one of {', '.join(KINDS)}")
        self.kind = kind
        self.wakes, self.hold_s = (int(gil[1]), int(gil[2]) / 1e6) if gil else (0, 0.0)
        self.summary = None
        self.timeline = CudaStepTimeline(RealClock())
        self.hooks = AnchorHooks(self.timeline.anchor) if kind == "anchors" else None
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._follow, name="kdvfs-probe", daemon=True)

    def __enter__(self) -> TimelineProbe:
        import torch

        if not torch.cuda.is_initialized():
            raise SystemExit("probe=: the step timeline's events need a CUDA GPU")
        if self.kind != "mark":
            self._thread.start()
        if self.hooks is not None:
            self.hooks.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def step(self) -> None:
        token = self.timeline.mark()
        if self.kind != "mark":
            self._queue.put(token)

    def _follow(self) -> None:
        while (token := self._queue.get()) is not None:
            if self.kind == "blocking":
                token[0].synchronize()
            end = self.timeline.wait(token)
            if self.wakes and end.duration_s is not None:
                self._hold_through(time.perf_counter(), end.duration_s)

    def _hold_through(self, start_s: float, step_s: float) -> None:
        """``wakes`` holds of the interpreter lock of ``hold_s`` each, evenly through ``step_s`` from ``start_s``
        (host s); stops early when the next step's end is already queued."""
        for wake in range(1, self.wakes + 1):
            time.sleep(max(0.0, start_s + wake * step_s / (self.wakes + 1) - time.perf_counter()))
            until_s = time.perf_counter() + self.hold_s
            while time.perf_counter() < until_s:  # Python bytecode: the lock is held (switch interval 5 ms)
                pass
            if not self._queue.empty():
                return

    def close(self) -> None:
        """Remove the anchor hooks, wait for the steps marked so far and stop the thread."""
        if self.hooks is not None:
            self.hooks.remove()
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
