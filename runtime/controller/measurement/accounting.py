"""Windows of steps at auto ("A") and under the policy ("B"), their seconds and joules per step, and the
paired estimate of the saving and slowdown (:mod:`kdvfs.runtime.controller.measurement.estimator`).

Owns: grouping matching steps into windows of at least ``window_steps`` steps and ``window_s`` seconds, each
window's arm (:class:`~kdvfs.runtime.controller.measurement.ab.AbSchedule`, read by the thread through
:attr:`Accounting.next_controlled`), its mean GPU step time (s) and its energy (J, the counter's rise between
the window's edges, read on the energy trace's own thread), the log's ``window`` and ``pair`` records and the
TensorBoard scalars. Steps that vary: durations in reference steps and the adjusted estimate.

Invariants: a step that changes mode and the ``settle_steps - 1`` after it belong to no window; a step that
does not match, or a mode change inside a window, discards the window so far; the last, partial window is
not counted; a window's joules are known once the counter was read past its end. Details:
docs/design/controller.md.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.event_log import EventLog
from kdvfs.runtime.controller.measurement.ab import AUTO, CONTROLLED, AbSchedule, Slot
from kdvfs.runtime.controller.measurement.estimator import (
    Interval,
    Paired,
    WindowRow,
    adjusted,
    mean_by_position,
    measured,
    net,
)
from kdvfs.runtime.controller.model.run_summary import EnergyCounter
from kdvfs.runtime.device.energy import Meter
from kdvfs.runtime.device.energy_trace import EnergyTrace
from kdvfs.runtime.device.errors import DeviceError
from kdvfs.runtime.device.host_time import Clock

LOG = logging.getLogger("kdvfs.controller")


@dataclass(frozen=True)
class Window:
    """One window: its steps, arm and pair, seconds per step, edges (host s), controlled steps, and joules
    per step and average power (W) once measured."""

    first_step: int
    last_step: int
    arm: str
    pair: int | None
    steps: int
    step_time_s: float
    start_s: float
    end_s: float
    controlled_steps: int
    energy_j_per_step: float | None = None
    avg_power_w: float | None = None
    kernel_steps: float | None = None
    """Its steps' mean expected kernel time in reference steps (None: a run of one shape)."""
    new_inputs: tuple[float, ...] | None = None
    """For each forward-call input position, its steps' mean count of calls whose input there had a shape new to
    the process (None: a run of one shape)."""
    new_input_steps: float | None = None
    """The share of its steps with any such input (None: a run of one shape): the covariate's earlier form, kept
    in the log to compare the forms on the same windows."""
    host_pace_s: float | None = None
    """Its steps' mean host pace (:func:`~kdvfs.runtime.controller.timing.gpu_timeline.host_pace_s`, s; None: a
    step of it without one): logged for study, in runs of one shape too (how the controller's own host work
    moves it), not in the run's estimate (docs/design/controller.md)."""

    @property
    def as_intended(self) -> bool:
        """Every step ran as the arm says (a B window during a back-off ran at auto)."""
        return ran_as_intended(self.arm, self.steps, self.controlled_steps)


def ran_as_intended(arm: str, steps: int, controlled_steps: int) -> bool:
    """Whether a window of ``steps`` steps, ``controlled_steps`` of them controlled, ran as its ``arm`` says: all
    controlled in a B window, none in an A window (:attr:`Window.as_intended`; for a ``window`` log record, its
    fields of those names)."""
    return controlled_steps == (steps if arm == CONTROLLED else 0)


WINDOW_FIELDS = tuple(field.name for field in dataclasses.fields(Window))
"""A window's fields in order (each a number, a string, None or a tuple of numbers: its log record is ``asdict``'s
without the deep copy)."""


class Accounting:
    """See docs/design/controller.md. ``meter``: the energy counter (None: no energy measurement)."""

    def __init__(self, meter: Meter | None, clock: Clock, config: ControllerConfig, settle_steps: int,
                 log: EventLog, next_request_s: Callable[[], float] = lambda: math.inf) -> None:
        self.windows: list[Window] = []
        self.schedule = AbSchedule(config.measurement.ab_share, config.measurement.ab_seed)
        self.slot: Slot = self.schedule.next()
        self.saved, self.slowdown = Estimate(self, "energy"), Estimate(self, "time")
        self.covariates: Callable[[int], tuple[float, tuple[float, ...]] | None] | None = None
        """Each step's covariates for a run whose steps vary (docs/design/controller.md); None: one shape."""
        self.pairs: dict[str, list[tuple[int, float]]] = {"energy": [], "time": []}
        """Each A/B pair's difference (%, a saving for energy, a slowdown for time) and its later window."""
        self._config, self._clock, self._settle_steps, self._log = config, clock, settle_steps, log
        self._trace = None if meter is None else EnergyTrace(meter.energy_j, clock,
                                                             config.measurement.energy_read_every_s, next_request_s)
        self._writer: Any = None
        if config.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(config.tensorboard)
        self._durations: list[float] = []
        self._steps_covariates: list[tuple[float, tuple[float, ...]]] = []
        self._paces_s: list[float | None] = []
        self._first_step, self._open_s, self._settle = 0, 0.0, 0
        self._marked, self._last_matched, self._held = True, True, False
        self._mode: bool | None = None
        self._unpaired: dict[int, int] = {}
        self._unmeasured: list[int] = []
        self._energy_pairs: list[tuple[int, int]] = []

    @property
    def next_controlled(self) -> bool:
        """Whether the coming steps belong to a B window."""
        return self.slot.arm == CONTROLLED

    def _say(self, event: str, message: str, **fields: Any) -> None:
        self._log.write(event, message=message, **fields)
        print(f"kdvfs: {message}", file=sys.stderr)

    def _energy_off(self, reason: str) -> None:
        if self._trace is not None:
            self._trace.stop()
            self._trace = None
            self._say("measurement", f"energy measurement off: {reason}; the run continues, step times are "
                                     "still measured", energy=False)

    def start(self, end_s: float) -> None:
        """Open the first window at the end of the run's first step (host s)."""
        if not self.schedule.measuring:
            self._say("measurement", "A/B measurement off (--ab-share 0): no auto windows, no measured saving, "
                                     "the guard cannot act", ab_share=0.0)
        if self._trace is not None:
            try:
                self._trace.start()
            except DeviceError as error:
                self._energy_off(f"the GPU's energy counter cannot be read ({error})")
        self._restart(end_s)

    def _restart(self, edge_s: float, superseded: bool = False, held: bool = False) -> None:
        """Open a window at ``edge_s`` (host s). ``superseded`` (never for an edge that closes a window, whose joules
        need it): the next step opens it again (it still settles, or most likely does not match either, as this one
        and the one before did), so a counter whose marks cost reads (paced) is not marked now; should the window
        stand after all, its first counted step marks its edge then, late. ``held`` (likewise never for a closing
        edge): a paced counter's mark waits for the next step's mode (:meth:`next_step`)."""
        self._durations, self._steps_covariates, self._paces_s, self._open_s = [], [], [], edge_s
        paced = self._trace is not None and self._trace.read_every_s > 0
        self._held = paced and held and not superseded
        self._marked = not paced or not (superseded or held)
        if self._marked:
            self._mark(edge_s)

    def next_step(self, controlled: bool) -> None:
        """The next step's mode, once decided (the issuer calls this after each step): the open window's edge held
        back is marked now, unless that step changes mode; then it settles and opens the window again at its end,
        and the edge would cost the paced counter reads for no window. Not called, the next :meth:`step` does this
        (its edge's mark then comes a step late)."""
        if not self._held:
            return
        self._held = False
        if self._settle_steps > 0 and self._mode is not None and controlled != self._mode:
            return  # the window is discarded; should it stand after all, its first counted step marks the edge
        self._marked = True
        self._mark(self._open_s)

    def _mark(self, edge_s: float) -> None:
        if self._trace is not None:
            try:
                self._trace.mark(edge_s)
            except DeviceError as error:
                self._energy_off(str(error))

    def window_elapsed_s(self, end_s: float) -> float:
        """How long the open window has lasted at host time ``end_s`` (s)."""
        return end_s - self._open_s

    def step(self, index: int, duration_s: float, end_s: float, matched: bool, controlled: bool,
             elapsed_s: float | None = None, weight: float = 1.0, host_pace_s: float | None = None) -> float | None:
        """One finished step (its GPU time, its end on the host clock; ``elapsed_s``: the open window's
        length, the job's under torchrun, default ``end_s`` minus its start); the slowdown (%) of an A/B pair
        this step completes, else None. ``weight``: the step's reference steps; ``host_pace_s``: the host's pace
        through it (s; logged with the windows of a run whose steps vary; docs/design/controller.md)."""
        self.next_step(controlled)
        changed = self._mode is not None and controlled != self._mode
        self._mode = controlled
        self._settle = self._settle_steps if changed else self._settle
        stretch, self._last_matched = not matched and not self._last_matched, matched
        if self._settle > 0 or not matched:
            self._settle = max(0, self._settle - 1)
            self._restart(end_s, superseded=self._settle > 0 or stretch, held=True)
            return None
        if not self._durations:
            self._first_step = index
            if not self._marked:
                self._held = True  # late: marked at the next step's mode, unless that discards the window
        known = None if self.covariates is None else self.covariates(index)
        self._durations.append(duration_s if self.covariates is None else duration_s * weight)
        self._steps_covariates.append(known or (weight, ()))
        self._paces_s.append(host_pace_s)
        windows = self._config.measurement
        long_enough = (self.window_elapsed_s(end_s) if elapsed_s is None else elapsed_s) >= windows.window_s
        if len(self._durations) < windows.window_steps or not long_enough:
            return None
        return self._close(index, end_s)

    def _close(self, index: int, end_s: float) -> float | None:
        if self._held:  # a window of one step: its opening edge, held at that step, is needed now
            self._held, self._marked = False, True
            self._mark(self._open_s)
        steps = len(self._durations)
        varying = self.covariates is not None
        window = Window(self._first_step, index, self.slot.arm, self.slot.pair, steps,
                        math.fsum(self._durations) / steps, self._open_s, end_s, steps if self._mode else 0,
                        kernel_steps=math.fsum(k for k, _ in self._steps_covariates) / steps if varying else None,
                        new_inputs=mean_by_position([n for _, n in self._steps_covariates]) if varying else None,
                        new_input_steps=sum(any(n) for _, n in self._steps_covariates) / steps if varying else None,
                        host_pace_s=_mean_or_none(self._paces_s))
        self.windows.append(window)
        self._unmeasured.append(len(self.windows) - 1)
        self._log.write("window", **{name: getattr(window, name) for name in WINDOW_FIELDS})  # asdict's
        self._scalars(index, step_time_s=window.step_time_s, controlled_fraction=window.controlled_steps / steps)
        self.slot = self.schedule.next()
        self._restart(end_s)
        slowdown_pct = self._pair(window)
        self.resolve()
        return slowdown_pct

    def _pair(self, window: Window) -> float | None:
        if window.pair is None or not window.as_intended:
            return None
        here = len(self.windows) - 1
        other = self._unpaired.pop(window.pair, None)
        if other is None:
            self._unpaired[window.pair] = here
            return None
        auto, controlled = (other, here) if self.windows[other].arm == AUTO else (here, other)
        slowdown_pct = (self.windows[controlled].step_time_s / self.windows[auto].step_time_s - 1.0) * 100
        self.pairs["time"].append((here, slowdown_pct))
        self._energy_pairs.append((auto, controlled))
        self._report("pair", window.last_step, slowdown_pct=slowdown_pct)
        return slowdown_pct

    def resolve(self) -> None:
        """Measure the joules of the windows the counter has been read past, and the pairs they complete."""
        if self._trace is not None and self._trace.error is not None:
            self._energy_off(f"the energy counter failed ({self._trace.error})")
        trace = self._trace
        while self._unmeasured and trace is not None and trace.covers(self.windows[self._unmeasured[0]].end_s):
            index = self._unmeasured.pop(0)
            window = self.windows[index]
            start_j, end_j = trace.energy_j(window.start_s), trace.energy_j(window.end_s)
            if start_j is None or end_j is None:
                continue
            joules = end_j - start_j
            per_step = window.steps
            self.windows[index] = dataclasses.replace(window, energy_j_per_step=joules / per_step,
                                                      avg_power_w=joules / (window.end_s - window.start_s))
            self._log.write("window_energy", last_step=window.last_step, **{
                k: getattr(self.windows[index], k) for k in ("energy_j_per_step", "avg_power_w")})
            self._scalars(window.last_step, energy_j_per_step=joules / per_step,
                          avg_power_w=self.windows[index].avg_power_w)
            trace.forget_before(window.end_s)
        while self._energy_pairs and self.windows[self._energy_pairs[0][1]].energy_j_per_step is not None \
                and self.windows[self._energy_pairs[0][0]].energy_j_per_step is not None:
            indices = self._energy_pairs.pop(0)
            auto, controlled = (self.windows[i] for i in indices)
            assert auto.energy_j_per_step is not None and controlled.energy_j_per_step is not None
            saved_pct = (1.0 - controlled.energy_j_per_step / auto.energy_j_per_step) * 100
            self.pairs["energy"].append((max(indices), saved_pct))
            self._report("pair_energy", max(auto.last_step, controlled.last_step), saved_pct=saved_pct)

    def _report(self, event: str, step: int, **fields: float) -> None:
        saved, slowdown = self.saved.interval(), self.slowdown.interval()
        self._log.write(event, step=step, **fields, measured=measured(saved, slowdown, *self.window_counts()).to_json())
        for name, interval in (("energy_saved_pct", saved), ("slowdown_pct", slowdown)):
            if interval is not None:
                self._scalars(step, **{f"measured_{name}": interval.mean_pct, f"measured_{name}_lo": interval.lo_pct,
                                       f"measured_{name}_hi": interval.hi_pct})
        if event == "pair" and slowdown is not None:
            LOG.info("kdvfs: measured slowdown %s, energy saved %s (%d pairs)", _text(slowdown), _text(saved),
                     slowdown.n)

    def _scalars(self, step: int, **values: float | None) -> None:
        if self._writer is not None:
            for name, value in values.items():
                if value is not None:
                    self._writer.add_scalar(f"kdvfs/{name}", value, step)

    def window_counts(self) -> tuple[int, int]:
        """Windows measured at auto, and entirely controlled."""
        auto = sum(w.arm == AUTO and w.as_intended for w in self.windows)
        return auto, sum(w.controlled_steps == w.steps for w in self.windows)

    def close(self) -> None:
        """Read the counter a last time, measure what it covers and stop. The last, partial window is not
        counted: the GPU may have stopped before its end."""
        if self._trace is not None:
            self._trace.stop()
            try:
                self._trace.read()
            except DeviceError as error:
                self._log.write("energy_unavailable", reason=str(error))
            self.resolve()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    @property
    def energy_thread_cpu_s(self) -> float | None:
        """The energy counter's reading thread's CPU time (s; once stopped; None: no energy measurement, or it
        was turned off)."""
        return None if self._trace is None else self._trace.thread_cpu_s

    def figures(self, controlled_share: float) -> dict[str, Any]:
        """Whole-run figures: window steps, mean GPU step time (s), joules per step (all windows with energy,
        windows entirely at auto, entirely controlled), the measured effect while controlling (``measured``)
        and over the run (``measured_net``), and the counter reads: :class:`RunSummary` fields by name."""
        def mean_energy(windows: list[Window]) -> float | None:
            known = [(w.energy_j_per_step, w.steps) for w in windows if w.energy_j_per_step is not None]
            steps = sum(n for _, n in known)
            return sum(j * n for j, n in known) / steps if steps else None

        steps = sum(w.steps for w in self.windows)
        effect = measured(self.saved.interval(), self.slowdown.interval(), *self.window_counts())
        return {
            "window_steps": steps, "windows": len(self.windows),
            "step_time_s": sum(w.step_time_s * w.steps for w in self.windows) / steps if steps else None,
            "energy_j_per_step": mean_energy(self.windows),
            "energy_j_per_step_auto": mean_energy([w for w in self.windows if w.controlled_steps == 0]),
            "energy_j_per_step_controlled": mean_energy([w for w in self.windows if w.controlled_steps == w.steps]),
            "measured": effect, "measured_net": net(effect, controlled_share),
            "ab_share": self.schedule.share, "energy_measured": self._trace is not None,
            "energy_reads": None if self._trace is None else self._trace.reads,
            "energy_counter": None if self._trace is None else EnergyCounter(**self._trace.figures()),
        }


class Estimate:
    """The run's measured effect on ``kind`` (``energy``: the saving, ``time``: the slowdown), in %: the adjusted
    estimate over the windows for a run whose steps vary, else the pairs' mean (docs/design/controller.md)."""

    def __init__(self, accounting: Accounting, kind: str) -> None:
        self._accounting, self.kind = accounting, kind

    def interval(self, since: int = 0) -> Interval | None:
        """The estimate over the windows from number ``since`` on (and the pairs completed in them)."""
        accounting = self._accounting
        if accounting.covariates is None:
            paired = Paired()
            for later, difference_pct in accounting.pairs[self.kind]:
                if later >= since:
                    paired.add(difference_pct)
            return paired.interval()
        rows = []
        for row in accounting.windows[since:]:
            value = row.energy_j_per_step if self.kind == "energy" else row.step_time_s
            if row.as_intended and value is not None and row.kernel_steps is not None:
                rows.append(WindowRow(row.arm == CONTROLLED, value, row.kernel_steps, row.new_inputs or (),
                                      (row.start_s + row.end_s) / 2))
        return adjusted(rows, -1.0 if self.kind == "energy" else 1.0)


def _mean_or_none(values: list[float | None]) -> float | None:
    """The mean of ``values``; None when any is None (or there are none)."""
    known = [v for v in values if v is not None]
    return math.fsum(known) / len(known) if known and len(known) == len(values) else None


def _text(interval: Interval | None) -> str:
    if interval is None:
        return "-"
    return f"{interval.mean_pct:+.2f}% [{interval.lo_pct:+.2f}, {interval.hi_pct:+.2f}]"
