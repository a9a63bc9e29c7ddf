"""What the training thread did in a benchmark's window: the interpreter's garbage-collection passes
(:class:`GcPasses`), its scheduling (:func:`thread_scheduling`) and where it blocked (:class:`ThreadSampler`).

Where it blocks is sampled from a process of its own, which shares no interpreter lock with it:
``ThreadSampler(tid)`` starts ``python training_thread.py PID TID PERIOD_S``, which reads the thread's state
every ``PERIOD_S`` from Linux ``/proc/PID/task/TID/stat`` and, while it is asleep (``S``, ``D``), the system
call it sleeps in (``/proc/PID/task/TID/syscall``: ``futex`` for a lock or condition variable; ``ioctl`` for a
driver; ``poll``, ``read``, ...; ``unreadable`` where the kernel does not let this process read it, e.g.
without ``CAP_SYS_PTRACE`` under Yama). A ``futex`` is named by the mapping its word lies in (:class:`Regions`,
``/proc/PID/maps``): ``futex python3.12`` (or ``libpython...``) is the interpreter lock, in the interpreter's
static data; ``futex [heap]`` or ``futex [anon]`` (a thread's malloc arena) a lock or condition variable
allocated at run time (the autograd engine's, the CUDA driver's); ``futex libcuda.so.1`` one in a library's
own data. :meth:`ThreadSampler.take` returns the samples since the last take, by state (``running`` for
``R``) and system call, and starts counting anew; the autograd engine's threads (``pt_autograd_N``, which
run the backward pass while the training thread waits on a condition variable) are sampled alongside, their
counts keyed ``pt_autograd_N: what``: a benchmark takes them at each window's end. Linux only.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import json
import math
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SYSCALLS_X86_64 = {0: "read", 1: "write", 7: "poll", 16: "ioctl", 23: "select", 35: "nanosleep", 202: "futex",
                   230: "clock_nanosleep", 232: "epoll_wait", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait"}
"""Names of the system calls a blocked thread is usually in (x86_64 numbers); others are ``syscall N``."""
AUTOGRAD_PREFIX = "pt_autograd_"
LOOK_EVERY_S = 0.1
"""How often the sampler looks for new autograd threads (s)."""


class GcPasses:
    """The interpreter's garbage-collection passes while entered: per generation, their count and seconds
    (``by_generation``: ``{"0": [count, seconds], ...}``), from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.by_generation: dict[str, list[float]] = {str(g): [0, 0.0] for g in range(3)}
        self._began_s = 0.0

    def __enter__(self) -> GcPasses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began_s = time.perf_counter()
            return
        count_s = self.by_generation[str(info["generation"])]
        count_s[0] += 1
        count_s[1] += time.perf_counter() - self._began_s


def thread_scheduling() -> dict[str, float]:
    """The calling thread's scheduling so far, from Linux ``/proc/thread-self``: seconds on a CPU and waiting on
    a run queue (``schedstat``; zeros where the kernel keeps no schedstats), and its voluntary and involuntary
    context switches (an involuntary one: another task took its CPU)."""
    on_cpu_ns, waiting_ns, _ = Path("/proc/thread-self/schedstat").read_text().split()
    status = dict(line.split(":\t") for line in Path("/proc/thread-self/status").read_text().splitlines()
                  if "ctxt_switches" in line)
    return {"on_cpu_s": int(on_cpu_ns) / 1e9, "waiting_s": int(waiting_ns) / 1e9,
            "voluntary": float(status["voluntary_ctxt_switches"]),
            "involuntary": float(status["nonvoluntary_ctxt_switches"])}



class Regions:
    """The memory mappings of process ``pid`` (``/proc/PID/maps``), to name the one an address lies in."""

    def __init__(self, pid: int) -> None:
        self._maps = Path(f"/proc/{pid}/maps")
        self._starts: list[int] = []
        self._regions: list[tuple[int, str]] = []
        self._load()

    def _load(self) -> None:
        regions = []
        for line in self._maps.read_text().splitlines():
            fields = line.split(maxsplit=5)
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            path = fields[5].strip() if len(fields) == 6 else "[anon]"
            regions.append((start, end, path if path.startswith("[") else Path(path).name))
        regions.sort()
        self._starts = [start for start, _, _ in regions]
        self._regions = [(end, name) for _, end, name in regions]

    def name_of(self, address: int) -> str:
        """The name of the mapping holding ``address`` (a file's name, ``[heap]``, ``[anon]``, ...; ``unmapped``),
        reading the maps again once where none holds it (the process mapped more since)."""
        for attempt in range(2):
            index = bisect.bisect_right(self._starts, address) - 1
            if index >= 0 and address < self._regions[index][0]:
                return self._regions[index][1]
            if attempt == 0:
                self._load()
        return "unmapped"


def blocked_in(task: Path, regions: Regions | None = None) -> str:
    """What the thread of ``task`` (``/proc/PID/task/TID``) does now: ``running``, the system call it sleeps in
    (a ``futex`` with the name of the mapping its word lies in, given the process's ``regions``), ``unreadable``
    or ``gone``."""
    try:
        stat = (task / "stat").read_text()
    except OSError:
        return "gone"
    if stat[stat.rindex(")") + 2] not in "SD":
        return "running"
    try:
        call, *arguments = (task / "syscall").read_text().split()
    except (OSError, ValueError):
        return "unreadable"
    if not call.isdigit():
        return call
    name = SYSCALLS_X86_64.get(int(call), f"syscall {call}")
    if name == "futex" and regions is not None and arguments:
        return f"futex {regions.name_of(int(arguments[0], 16))}"
    return name


def autograd_threads(pid: int) -> dict[str, Path]:
    """The autograd engine's device threads of process ``pid`` (named ``pt_autograd_N``: they run the backward
    pass while the training thread waits for it), by name."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            name = (task / "comm").read_text().strip()
            if name.startswith(AUTOGRAD_PREFIX):
                found[name] = task
    return found


def sample(pid: int, tid: int, period_s: float) -> None:
    """The sampler process: count :func:`blocked_in` of the thread ``tid`` (as is) and of the autograd threads
    (as ``NAME: what``, looked for every ``LOOK_EVERY_S``) every ``period_s``; on each line on stdin, print
    the counts since the last as one JSON line and start anew; end with stdin."""
    task, regions, counts = Path(f"/proc/{pid}/task/{tid}"), Regions(pid), {}
    helpers: dict[str, Path] = {}
    stdin, looked_s = sys.stdin.fileno(), -math.inf
    while True:
        if select.select([stdin], [], [], 0.0)[0]:
            if not os.read(stdin, 4096):
                return
            print(json.dumps(counts), flush=True)
            counts = {}
        if time.perf_counter() - looked_s > LOOK_EVERY_S:
            helpers, looked_s = autograd_threads(pid), time.perf_counter()
        for what in (blocked_in(task, regions),
                     *(f"{name}: {blocked_in(helper, regions)}" for name, helper in helpers.items())):
            counts[what] = counts.get(what, 0) + 1
        time.sleep(period_s)


class ThreadSampler:
    """See the module docstring. ``tid``: the thread's native id (``threading.get_native_id()``)."""

    def __init__(self, tid: int, period_s: float = 200e-6) -> None:
        self._process = subprocess.Popen([sys.executable, __file__, str(os.getpid()), str(tid), str(period_s)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def take(self) -> dict[str, int]:
        """The samples since the last take (or the start), by what the thread did."""
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write("\n")
        self._process.stdin.flush()
        counts: dict[str, int] = json.loads(self._process.stdout.readline())
        return counts

    def close(self) -> None:
        """End the sampler process."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(5)
        if self._process.stdout is not None:
            self._process.stdout.close()

    def __enter__(self) -> ThreadSampler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


if __name__ == "__main__":
    sample(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
