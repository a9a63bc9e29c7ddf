"""A GPU's cumulative energy counter as a function of host time, read at the counter's own pace.

NVML's total-energy counter updates only a few times a second on an H200 and a read costs milliseconds of CPU.
:class:`EnergyTrace` keeps timed values of it, ``(host s, J)`` points between which
:meth:`EnergyTrace.energy_j` interpolates linearly. Paced (``read_every_s > 0``), a background thread reads
it: it learns the counter's update clock (:class:`UpdateClock`, searched for in a few reads a period over about a
dozen periods, :mod:`kdvfs.runtime.device.update_search`), reads just after the expected updates (those
around each :meth:`EnergyTrace.mark` first), about once per update it needs, places each value at its update,
keeps the clock fitted (in a few reads back to back now and then, never a period of them), and starts no read
within ``READ_GUARD_S`` before a clock request (a change's measurement once put off ``RELOCK_WAIT_S``); the thread
that issues clock requests never reads it. A
counter with no usable period has each value placed at its read. With ``read_every_s == 0`` only
:meth:`EnergyTrace.read` reads it, on the caller's thread. The algorithm: ``docs/design/device-safety.md``.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from kdvfs.runtime.device.host_time import Clock
from kdvfs.runtime.device.update_clock import MARGIN_S, NARROW_READS, Read, UpdateClock, measured_s
from kdvfs.runtime.device.update_search import search_clock

RELOCK_S = 20.0
"""A change is measured again at least this often (s), and whenever the clock's uncertainty reaches an eighth of
its period or a read contradicts it."""
READ_GUARD_S = 0.01
"""A read does not start this close before a clock request (s), unless it would then miss its update."""
RELOCK_WAIT_S = 0.25
"""A change put off for clock requests is measured anyway once it has waited this long (s): in a controlled step
the requests come milliseconds apart and would put it off for good, and the clock, no longer measured, drifts off the
updates (each value then goes to the wrong place, and a window's energy with it)."""



class EnergyTrace:
    """See the module docstring.

    Args:
        read_j: reads the counter (J).
        clock: the host time base the reads are timed and the thread sleeps on.
        read_every_s: paced background reads at least this often with nothing asked (s); 0: caller's reads only.
        next_request_s: when the next clock request is due (host s; infinite when none is known).
    """

    def __init__(self, read_j: Callable[[], float], clock: Clock, read_every_s: float,
                 next_request_s: Callable[[], float] = lambda: math.inf) -> None:
        self._read_j, self._clock, self.read_every_s, self._next_request_s = read_j, clock, read_every_s, next_request_s
        self._times_s: list[float] = []
        self._energies_j: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._woken = threading.Event()
        self._marks: list[float] = []
        self._thread: threading.Thread | None = None
        self._last: Read | None = None
        self._wanted: list[float] = []
        """Expected updates to read just after (host s)."""
        self._read_now = self._doubt = self._lost = False
        self._relock_after_s = -math.inf
        self._put_off_since_s = math.inf
        """Since when the pending change measurement has been put off for clock requests (infinite: not put off)."""
        self._durations_s: deque[float] = deque(maxlen=16)
        self._searched: list[Read] | None = None
        """The reads of the search for the update clock under way, kept until it is found (None: none)."""
        self.updates: UpdateClock | None = None
        """The counter's update clock once learned (None: not yet, or the counter has no usable period)."""
        self.error: BaseException | None = None
        self.reads = self.calibration_reads = self.relock_reads = 0
        """Reads in all; of them, back to back to learn the clock, and to measure a change again."""
        self.read_s = 0.0
        """Wall time in reads (s)."""
        self.thread_cpu_s = 0.0
        """CPU time of the reading thread (s), once it stopped."""
        self.calibration_cpu_s = 0.0
        """Of it, learning the update clock (s): a one-time cost, again only if the clock is lost."""

    def start(self) -> None:
        """Paced: start the reading thread (it learns the clock first). Else: take the first reading."""
        if self.read_every_s <= 0:
            self.read()
            return
        self._thread = threading.Thread(target=self._run, name="kdvfs-energy", daemon=True)
        self._thread.start()

    def mark(self, time_s: float) -> None:
        """The counter's value at ``time_s`` (host s, now or just past) is wanted: paced, read the updates
        around it (see the module docstring); else read now."""
        if self.read_every_s <= 0:
            self.read()
            return
        with self._lock:
            self._marks.append(time_s)
        self._woken.set()

    def read(self) -> Read:
        """Read the counter once; record and return the read."""
        before_s = self._clock.now_s()
        energy_j = self._read_j()
        after_s = self._clock.now_s()
        self.reads += 1
        self.read_s += after_s - before_s
        self._durations_s.append(after_s - before_s)
        previous, self._last = self._last, (before_s, after_s, energy_j)
        if self._searched is not None:
            self._searched.append(self._last)
        else:
            self._record(previous, self._last)
        return self._last

    def _record(self, previous: Read | None, current: Read) -> None:
        """Keep the value ``current`` read, at its place (see :meth:`_place`), if new since ``previous``."""
        if previous is None or current[2] != previous[2]:
            time_s = self._place(previous, current)
            if time_s is None:
                return
            with self._lock:
                if self._times_s and time_s <= self._times_s[-1]:
                    time_s = math.nextafter(self._times_s[-1], math.inf)
                self._times_s.append(time_s)
                self._energies_j.append(current[2])

    def _place(self, previous: Read | None, current: Read) -> float | None:
        """Where a new value goes (host s; None: not kept, it may be either of two updates'). Two reads close
        around its change measure it (the clock is fitted to it); a change where the clock expects none casts
        doubt on the clock."""
        updates = self.updates
        if previous is None or updates is None:
            return (current[0] + current[1]) / 2
        between_s = measured_s(previous, current)
        with self._lock:
            last_s = max(previous[0], self._times_s[-1] if self._times_s else -math.inf)
        if current[1] - previous[0] <= NARROW_READS * self._read_s:
            updates.measured(between_s)
            self._doubt = False
            update_s = updates.at_or_before(current[1])
            return update_s if update_s > last_s else between_s
        unsure_s = self._uncertainty_s()
        update_s = updates.at_or_before(current[1])
        if update_s > updates.at_or_before(current[0] + self._read_s) > previous[0] - unsure_s:
            return None  # a slow read across an expected update, the one before it not read yet: either's value
        if update_s > previous[0] - unsure_s:
            return max(update_s, math.nextafter(last_s, math.inf))
        self._doubt = True
        return between_s

    @property
    def _read_s(self) -> float:
        """A typical recent read (s): the median of the last few, so that one slow read does not widen every
        window."""
        return statistics.median(self._durations_s) if self._durations_s else 0.0

    def _uncertainty_s(self) -> float:
        assert self.updates is not None
        return self.updates.uncertainty_s(self._clock.now_s(), self._read_s)

    def _run(self) -> None:
        try:
            self._calibrate()
            while not self._stop.is_set():
                self._woken.clear()
                if self._lost:
                    self._calibrate()
                due_s, deadline_s, action = self._next_read()
                if self._clock.sleep_until(due_s, self._woken) and self._guard(deadline_s):
                    action()
        except BaseException as error:  # seen by the caller through .error
            self.error = error
        finally:
            self.thread_cpu_s = time.thread_time()

    def _calibrate(self) -> None:
        """Learn the update clock (:func:`~kdvfs.runtime.device.update_search.search_clock`); then keep the values
        its search read, each at its place."""
        self._lost, self._doubt, self.updates = False, False, None
        reads, self._searched, began_cpu_s = self.reads, [], time.thread_time()
        try:
            self.updates = search_clock(self.read, self._clock, self._stop, lambda: self._read_s)
        finally:
            searched, self._searched = self._searched, None
            self.calibration_reads += self.reads - reads
            self.calibration_cpu_s += time.thread_time() - began_cpu_s
            previous: Read | None = None
            for current in searched:
                self._record(previous, current)
                previous = current

    def _next_read(self) -> tuple[float, float, Callable[[], None]]:
        """When the next read is due, the latest it may start and what it is (see the module docstring)."""
        now_s, updates = self._clock.now_s(), self.updates
        with self._lock:
            marks, self._marks = self._marks, []
        for mark_s in marks:
            if updates is None:
                self._read_now = True
                continue
            if self._last is None or self._last[0] < updates.at_or_before(mark_s) + self._uncertainty_s():
                self._read_now = True  # the update before the mark is not surely read yet
            self._wanted.append(updates.after(mark_s))
        if self._read_now:
            return now_s, now_s if updates is None else updates.after(now_s) - self._read_s, self._read_at_once
        last_s = -math.inf if self._last is None else self._last[0]
        if updates is None:
            return last_s + self.read_every_s, last_s + self.read_every_s, self._read
        relock_s = now_s if self._doubt else min(updates.last_measured_s + RELOCK_S, self._unsure_from_s())
        relock_s = max(self._relock_after_s, relock_s)
        update_s = min([updates.after(last_s + self.read_every_s - updates.period_s), *self._wanted])
        if relock_s <= update_s:  # measure a change: the planned read's, unless that overshoots by a quarter
            if update_s - relock_s > (relock_s - updates.last_measured_s) / 4:
                update_s = updates.after(relock_s)
            return update_s - self._uncertainty_s() - MARGIN_S, update_s, self._relock
        return update_s + self._uncertainty_s() + MARGIN_S, update_s + updates.period_s - self._read_s, self._read

    def _unsure_from_s(self) -> float:
        """When the clock's uncertainty reaches an eighth of its period (host s)."""
        updates = self.updates
        assert updates is not None
        now_s = self._clock.now_s()
        rate = self._uncertainty_s() - updates.uncertainty_s(now_s - 1.0, self._read_s)  # per second
        return now_s + (updates.period_s / 8 - self._uncertainty_s()) / rate

    def _guard(self, deadline_s: float) -> bool:
        """Hold the read back while a clock request is due within ``READ_GUARD_S`` and the read can wait until
        just after it (before ``deadline_s``); False when it waited (plan again)."""
        now_s, request_s = self._clock.now_s(), self._next_request_s()
        if not now_s < request_s <= now_s + READ_GUARD_S or request_s + MARGIN_S > deadline_s:
            return True
        self._clock.sleep_until(request_s + MARGIN_S, self._woken)
        return False

    def _read_at_once(self) -> None:
        """A mark's read of the update before it: at once, unless an expected update is that close (then just
        after it)."""
        updates = self.updates
        if updates is not None:
            next_s = updates.after(self._clock.now_s() - self._uncertainty_s())
            if next_s - self._uncertainty_s() - self._read_s < self._clock.now_s():
                self._clock.sleep_until(next_s + self._uncertainty_s() + MARGIN_S, self._stop)
        self._read_now = False
        self.read()

    def _read(self) -> None:
        """A planned read just after an expected update; one that finds the old value measures the change, in a
        few reads back to back."""
        previous, updates = self._last, self.updates
        current = self.read()
        if updates is None:
            return
        update_s = updates.at_or_before(current[0])
        if previous is not None and current[2] == previous[2] and previous[1] < update_s - self._uncertainty_s():
            self._measure(self._clock.now_s() + self._uncertainty_s() + self._read_s)
        self._served()

    def _relock(self) -> None:
        """Measure the change of the expected update ahead (the next one if that is too close): back to back from
        before it until its uncertainty past it; put off by half a period when a clock request falls in
        between, for at most ``RELOCK_WAIT_S``."""
        updates = self.updates
        assert updates is not None
        unsure_s = self._uncertainty_s()
        update_s = updates.after(self._clock.now_s() + unsure_s)
        if not self._clock.sleep_until(update_s - unsure_s - MARGIN_S, self._stop):
            return
        now_s, until_s = self._clock.now_s(), update_s + unsure_s + self._read_s
        if now_s < self._next_request_s() <= until_s + READ_GUARD_S:
            self._put_off_since_s = min(self._put_off_since_s, now_s)
            if now_s - self._put_off_since_s < RELOCK_WAIT_S:
                self._relock_after_s = now_s + updates.period_s / 2
                return
        self._put_off_since_s = math.inf
        self.read()  # the value before the change
        self.relock_reads += 1
        self._measure(until_s)
        self._served()

    def _served(self) -> None:
        """Forget the wanted updates the last read has read."""
        if self.updates is not None and self._last is not None:
            update_s = self.updates.at_or_before(self._last[0])
            self._wanted = [s for s in self._wanted if s > update_s + self.updates.period_s / 2]

    def _measure(self, until_s: float) -> None:
        """Read back to back until the value changes from the last read's (the change is measured: see
        :meth:`_place`) or ``until_s`` (host s); not found there, the clock is less sure (its slack grows by its
        uncertainty) or, once unsure by half a period, lost (learned again)."""
        assert self.updates is not None and self._last is not None
        reads, before_j = self.reads, self._last[2]
        while not self._stop.is_set() and self._clock.now_s() < until_s:
            if self.read()[2] != before_j:
                break
        else:
            self.updates.slack_s += self._uncertainty_s()
            self._lost = self._uncertainty_s() >= self.updates.period_s / 2
        self.relock_reads += self.reads - reads

    def covers(self, time_s: float) -> bool:
        """Whether the counter is known at ``time_s`` (an update at or after it has been seen)."""
        with self._lock:
            return bool(self._times_s) and self._times_s[0] <= time_s <= self._times_s[-1]

    def energy_j(self, time_s: float) -> float | None:
        """The counter's value at ``time_s`` (J), None unless :meth:`covers` it."""
        if not self.covers(time_s):
            return None
        with self._lock:
            return float(np.interp(time_s, self._times_s, self._energies_j))

    def forget_before(self, time_s: float) -> None:
        """Drop values no longer needed: those before the last one at or before ``time_s``."""
        with self._lock:
            keep = max(0, int(np.searchsorted(self._times_s, time_s, side="right")) - 1)
            del self._times_s[:keep], self._energies_j[:keep]

    def stop(self) -> None:
        """Stop the reading thread."""
        if self._thread is not None:
            self._stop.set()
            self._woken.set()
            self._thread.join()
            self._thread = None

    def figures(self) -> dict[str, Any]:
        """For the summary: the reads (all; to learn the clock and to measure a change again), the median read (s),
        the update period learned (s; None: none) and the reading thread's CPU (s; of it, learning the clock)."""
        return {"reads": self.reads, "calibration_reads": self.calibration_reads, "relock_reads": self.relock_reads,
                "read_s": statistics.median(self._durations_s) if self._durations_s else None,
                "update_period_s": None if self.updates is None else self.updates.period_s,
                "thread_cpu_s": self.thread_cpu_s, "calibration_cpu_s": self.calibration_cpu_s}
