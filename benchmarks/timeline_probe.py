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
  ``gpu_timeline.POLL_S``, sleeping in between).

The run of 2026-12-02 (``benchmarks/results/controller_online_hf_probe_h200.md``) was of the code before the
controller polled: its ``blocking`` was the timeline's own wait then, its ``polling`` this module's loop at
the same 1 ms.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from kdvfs.runtime.controller.gpu_timeline import CudaStepTimeline
from kdvfs.runtime.device.host_time import RealClock

KINDS = ("mark", "blocking", "polling")


class TimelineProbe:
    """Used as the harness uses a controller: enter, ``step()`` at every step hook, ``close()`` (or exit);
    no summary."""

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise SystemExit(f"probe={kind!r}: expected one of {', '.join(KINDS)}")
        self.kind = kind
        self.summary = None
        self.timeline = CudaStepTimeline(RealClock())
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._follow, name="kdvfs-probe", daemon=True)

    def __enter__(self) -> TimelineProbe:
        import torch

        if not torch.cuda.is_initialized():
            raise SystemExit("probe=: the step timeline's events need a CUDA GPU")
        if self.kind != "mark":
            self._thread.start()
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
            self.timeline.wait(token)

    def close(self) -> None:
        """Wait for the steps marked so far and stop the thread."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
