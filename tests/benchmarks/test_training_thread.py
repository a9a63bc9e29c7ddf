"""What a benchmark records of the training thread (``benchmarks/training_thread.py``): garbage-collection
passes, scheduling, and where it blocks (a thread waiting on a lock is seen in ``futex``, named by where the
lock lives: the interpreter's lock in the interpreter, a ``threading.Lock`` where it was allocated; one sleeping in its
sleep, one spinning as running, from a process of its own)."""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchmarks.scripts import script_module

PR_SET_NAME = 15


@pytest.fixture(scope="module")
def training_thread() -> ModuleType:
    return script_module("training_thread")


def _in_thread(work: Callable[[threading.Event], None]) -> tuple[threading.Thread, threading.Event, int]:
    """A thread running ``work(stop)`` and its native id."""
    stop, started = threading.Event(), threading.Event()
    ids: list[int] = []

    def run() -> None:
        ids.append(threading.get_native_id())
        started.set()
        work(stop)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait()
    return thread, stop, ids[0]


def _wait_on_lock(stop: threading.Event) -> None:
    lock = threading.Lock()
    lock.acquire()
    lock.acquire(timeout=1.0)  # nobody releases it: a futex wait


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(100))


@pytest.mark.parametrize(("work", "expected"), [(_wait_on_lock, "futex"), (lambda stop: time.sleep(1.0),
                                                                           "clock_nanosleep")])
def test_a_blocked_thread_shows_the_call_it_sleeps_in(training_thread: ModuleType,
                                                      work: Callable[[threading.Event], None], expected: str) -> None:
    thread, _, tid = _in_thread(work)
    time.sleep(0.1)
    assert training_thread.blocked_in(Path(f"/proc/self/task/{tid}")) == expected
    thread.join()  # the Python thread is done; its OS thread may run a little longer, then it is gone
    deadline_s = time.perf_counter() + 1.0
    while training_thread.blocked_in(Path(f"/proc/self/task/{tid}")) != "gone" and time.perf_counter() < deadline_s:
        time.sleep(1e-3)
    assert training_thread.blocked_in(Path(f"/proc/self/task/{tid}")) == "gone"


def _sampled(training_thread: ModuleType, work: Callable[[threading.Event], None]) -> tuple[dict[str, int], ...]:
    """What the sampler process counted of a thread doing ``work`` for 0.3 s, and after it ended."""
    thread, stop, tid = _in_thread(work)
    with training_thread.ThreadSampler(tid, period_s=1e-3) as sampled:
        time.sleep(0.3)
        during = sampled.take()
        stop.set()
        thread.join()
        time.sleep(0.1)
        return during, sampled.take()


def test_the_sampler_process_counts_per_take(training_thread: ModuleType) -> None:
    blocked, after = _sampled(training_thread, _wait_on_lock)
    # Its state is always readable; the call it sleeps in only with the right to trace it (root, or no Yama).
    # The lock was allocated at run time: on the heap, or in a thread's malloc arena (an anonymous mapping).
    waiting = {"futex [heap]", "futex [anon]", "unreadable"}
    assert sum(blocked.values()) > 20 and set(blocked) <= {*waiting, "running"}
    assert sum(blocked.get(what, 0) for what in waiting) > 0.8 * sum(blocked.values())
    assert "gone" in after


def test_a_thread_waiting_for_the_interpreter_lock_is_seen_in_the_interpreter(training_thread: ModuleType) -> None:
    def wake_often(stop: threading.Event) -> None:
        while not stop.is_set():
            time.sleep(1e-3)  # each wake-up wants the lock back from the spinning thread below

    thread, stop, tid = _in_thread(wake_often)
    before_s = sys.getswitchinterval()
    sys.setswitchinterval(0.2)  # the spinning thread is asked to let go of the lock only every 0.2 s
    try:
        with training_thread.ThreadSampler(tid, period_s=1e-3) as sampled:
            end_s = time.perf_counter() + 0.5
            while time.perf_counter() < end_s:
                pass
            counts = sampled.take()
    finally:
        sys.setswitchinterval(before_s)
        stop.set()
        thread.join()
    in_interpreter = sum(n for what, n in counts.items() if what.startswith(("futex python", "futex libpython")))
    assert in_interpreter + counts.get("unreadable", 0) > 0.6 * sum(counts.values())


def test_the_autograd_threads_are_sampled_by_name(training_thread: ModuleType) -> None:
    libc = ctypes.CDLL(None)

    def named_and_waiting(stop: threading.Event) -> None:
        libc.prctl(PR_SET_NAME, b"pt_autograd_0", 0, 0, 0)  # the name the autograd engine gives its threads
        stop.wait()

    thread, stop, _ = _in_thread(named_and_waiting)
    try:
        time.sleep(0.05)
        assert set(training_thread.autograd_threads(os.getpid())) == {"pt_autograd_0"}
        with training_thread.ThreadSampler(threading.get_native_id(), period_s=1e-3) as sampled:
            time.sleep(0.3)
            counts = sampled.take()
    finally:
        stop.set()
        thread.join()
    assert sum(n for what, n in counts.items() if what.startswith("pt_autograd_0: ")) > 20


def test_an_address_is_named_by_its_mapping(training_thread: ModuleType) -> None:
    regions = training_thread.Regions(os.getpid())
    assert regions.name_of(0) == "unmapped"
    assert regions.name_of(id(training_thread.Regions)) in {"[heap]", "[anon]"}


def test_a_spinning_thread_is_running(training_thread: ModuleType) -> None:
    counts, _ = _sampled(training_thread, _spin)
    assert counts.get("running", 0) > 0.5 * sum(counts.values())


def test_gc_passes_are_counted_by_generation_while_entered(training_thread: ModuleType) -> None:
    with training_thread.GcPasses() as passes:
        gc.collect()
    gc.collect()
    count, seconds = passes.by_generation["2"]
    assert count == 1 and seconds > 0


def test_a_sleeping_thread_shows_a_voluntary_switch(training_thread: ModuleType) -> None:
    before = training_thread.thread_scheduling()
    time.sleep(0.01)
    after = training_thread.thread_scheduling()
    assert set(before) == {"on_cpu_s", "waiting_s", "voluntary", "involuntary"}
    assert after["voluntary"] >= before["voluntary"] + 1 and after["on_cpu_s"] >= before["on_cpu_s"] >= 0
