"""What reading a GPU's energy counter at its own pace costs and how exactly it places each window's energy, replayed
on a real counter.

    python -m benchmarks.h200.energy_reads record DIR            # on the GPU machine (read-only NVML, the guard)
    python -m benchmarks.h200.energy_reads replay DIR OUT.json [--label NAME]   # this kdvfs, on a CPU
    python -m benchmarks.h200.energy_reads report DIR A.json [B.json ...] [--name NAME]

``record`` reads the energy counter back to back on one thread (each read's start, end and value) and NVML's
instantaneous power field every ``POWER_EVERY_S`` on another, beside a training process of each workload of
``WORKLOADS`` (``examples/gpt.py``), through the recording guard: the GPU's clocks are never touched. The counter
read back to back brackets every update within a read or two: its update clock (period, phase, drift) is known
in hindsight (:func:`truth`). ``replay`` runs :class:`~kdvfs.runtime.device.energy_trace.EnergyTrace` (whichever
kdvfs is first on ``PYTHONPATH``) against that recorded counter on a virtual clock: each read takes the time a
recorded read took and returns the value the counter held at its middle; window edges are marked every
``WINDOW_S`` (the A/B windows' length on these steps). It counts the reads (to learn the update clock, to measure
a change again, the rest) and compares each window's energy with the recorded counter's (its updates at their
hindsight instants, interpolated as the trace does). ``report`` adds how well the power field would stand in for
the counter (its samples held, integrated over windows of ``WINDOW_UPDATES`` counter updates, at the lag that
fits best in hindsight) and puts the replays side by side.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import math
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.provenance import host, nvidia_smi, provenance, provenance_lines, utc_now, write_results
from benchmarks.h200.overhead import field_value
from kdvfs.common.paths import REPO_ROOT
from kdvfs.runtime.controller.config import MeasurementConfig
from kdvfs.runtime.device.energy_trace import EnergyTrace
from kdvfs.runtime.testing.scripted_clock import ScriptedClock

GUARD = "benchmarks.common.nvml_guard"
WORKLOADS = {"gpt3xl-b4": ["--size", "gpt3xl", "--batch", "4", "--steps", "600"],
             "gpt2s-b8": ["--size", "gpt2s", "--batch", "8", "--steps", "2000"]}
"""Each training process beside which the counter is recorded (``examples/gpt.py`` arguments)."""
IDLE_S = 3.0
"""Recorded before the training process starts and after it ends (s)."""
POWER_EVERY_S = 0.004
WINDOW_S = 1.6
WINDOW_UPDATES = 16
BLOCK_S = 30.0
"""Replayed read rates are reported per block of this many seconds (the first holds the update clock's search)."""


def record(folder: Path) -> None:
    """Every workload's recording into ``folder/WORKLOAD.npz`` (``counter``: start s, end s, mJ per read;
    ``power``: start s, end s, mW per read), and ``folder/run.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    started_utc = utc_now()
    nvml = importlib.import_module(GUARD)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    runs = {}
    for label, arguments in WORKLOADS.items():
        counter, power = _record_one(nvml, handle, [sys.executable, "examples/gpt.py", *arguments])
        np.savez_compressed(folder / f"{label}.npz", counter=np.array(counter), power=np.array(power))
        runs[label] = {"counter_reads": len(counter), "power_reads": len(power)}
        print(f"{label}: {len(counter)} counter reads, {len(power)} power reads", flush=True)
    nvml.nvmlShutdown()
    record = {**host("benchmarks.h200.energy_reads"),
              "started_utc": started_utc, "gpu": nvidia_smi(header=False), "workloads": WORKLOADS, "runs": runs}
    (folder / "run.json").write_text(json.dumps(record, indent=1))


def _record_one(nvml: Any, handle: Any, command: list[str]) -> tuple[list[tuple[float, float, float]], ...]:
    """The counter read back to back and the power field every ``POWER_EVERY_S``, from ``IDLE_S`` before
    ``command`` runs until ``IDLE_S`` after it ended."""
    stop, counter, power = threading.Event(), [], []

    def read_counter() -> None:
        while not stop.is_set():
            start_s = time.perf_counter()
            value = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            counter.append((start_s, time.perf_counter(), float(value)))

    def read_power() -> None:
        while not stop.is_set():
            start_s = time.perf_counter()
            value = _instant_mw(nvml, handle)
            power.append((start_s, time.perf_counter(), value))
            time.sleep(POWER_EVERY_S)

    threads = [threading.Thread(target=read_counter, daemon=True), threading.Thread(target=read_power, daemon=True)]
    for thread in threads:
        thread.start()
    time.sleep(IDLE_S)
    subprocess.run(command, cwd=REPO_ROOT, check=True)
    time.sleep(IDLE_S)
    stop.set()
    for thread in threads:
        thread.join()
    return counter, power


def _instant_mw(nvml: Any, handle: Any) -> float:
    """NVML's instantaneous power field (mW; NaN where the driver does not give it)."""
    value = field_value(nvml, handle, nvml.NVML_FI_DEV_POWER_INSTANT)
    return math.nan if value is None else value


def truth(counter: np.ndarray) -> dict[str, Any]:
    """The counter's updates in hindsight: each change bracketed by the last read of the old value (its start)
    and the first of the new (its end); the update instants a least-squares line through the brackets' middles
    by update count (``times_s``), their values (``energies_j``), and how the clock held: the line's period and
    residual spread, and how far a line fitted on the first 20 s is off at the end (the drift)."""
    changed = np.nonzero(np.diff(counter[:, 2]) != 0)[0] + 1
    middles_s = (counter[changed - 1, 0] + counter[changed, 1]) / 2
    period_s = float(np.median(np.diff(middles_s)))
    counts = np.concatenate([[0.0], np.cumsum(np.round(np.diff(middles_s) / period_s))])
    slope, intercept = np.polyfit(counts, middles_s, 1)
    early = middles_s < middles_s[0] + 20.0
    early_slope, early_intercept = np.polyfit(counts[early], middles_s[early], 1)
    end_drift_s = float(middles_s[-1] - (early_slope * counts[-1] + early_intercept))
    return {"times_s": slope * counts + intercept, "energies_j": counter[changed, 2] / 1e3,
            "period_s": float(slope), "residual_sd_s": float(np.std(middles_s - slope * counts - intercept)),
            "bracket_s": float(np.median(counter[changed, 1] - counter[changed - 1, 0])),
            "missed_updates": int(np.sum(np.diff(counts) != 1)), "span_s": float(middles_s[-1] - middles_s[0]),
            "drift_s_per_s": abs(end_drift_s) / float(middles_s[-1] - middles_s[0] - 20.0),
            "read_s": float(np.median(counter[:, 1] - counter[:, 0]))}


class RecordedCounter:
    """The recorded counter on ``clock``: a read takes the next recorded read's duration (in turn) and returns
    the value held at its middle (J x 1e3, as NVML gives mJ)."""

    def __init__(self, clock: ScriptedClock, updates: dict[str, Any], durations_s: np.ndarray) -> None:
        self.clock, self.times_s, self.energies_j = clock, updates["times_s"], updates["energies_j"]
        self.durations_s, self.reads = durations_s, 0

    def __call__(self) -> float:
        start_s = self.clock.now_s()
        duration_s = float(self.durations_s[self.reads % len(self.durations_s)])
        self.reads += 1
        index = max(0, int(np.searchsorted(self.times_s, start_s + duration_s / 2, side="right")) - 1)
        self.clock.advance_to(start_s + duration_s)
        return float(self.energies_j[index])


def replay_one(counter: np.ndarray) -> dict[str, Any]:
    """:class:`EnergyTrace` on the recorded ``counter`` (see the module docstring): read rates per ``BLOCK_S``
    and each window's energy error against the recorded counter's (% of the window's energy)."""
    updates = truth(counter)
    start_s, end_s = float(updates["times_s"][0]), float(updates["times_s"][-1])
    marks_s = list(np.arange(start_s + 2 * WINDOW_S, end_s - WINDOW_S, WINDOW_S))
    box: list[Any] = []
    blocks: list[tuple[int, int, int]] = []
    script = [(s, lambda s=s: box[0].mark(s)) for s in marks_s]
    script += [(s, lambda: blocks.append((box[0].reads, box[0].calibration_reads, box[0].relock_reads)))
               for s in np.arange(start_s + BLOCK_S, end_s, BLOCK_S)]
    clock = ScriptedClock(end_s, script, start_s)
    trace = EnergyTrace(RecordedCounter(clock, updates, counter[:, 1] - counter[:, 0]), clock,
                        MeasurementConfig().energy_read_every_s)
    box.append(trace)
    trace.start()
    clock.at_end.wait(600)
    errors = []
    for a_s, b_s in itertools.pairwise(marks_s):
        got_a, got_b = trace.energy_j(a_s), trace.energy_j(b_s)
        true_j = np.interp([a_s, b_s], updates["times_s"], updates["energies_j"])
        if got_a is not None and got_b is not None:
            errors.append(100 * ((got_b - got_a) - (true_j[1] - true_j[0])) / (true_j[1] - true_j[0]))
    trace.stop()
    rates, previous = [], (0, 0, 0)
    for block in blocks:
        rates.append({key: (now - before) / BLOCK_S for key, now, before in
                      zip(("reads", "calibration", "relock"), block, previous, strict=True)})
        previous = block
    return {"seconds": end_s - start_s, "reads": trace.reads, "calibration_reads": trace.calibration_reads,
            "relock_reads": trace.relock_reads, "reads_per_s": trace.reads / (end_s - start_s),
            "per_block": rates, "windows": len(marks_s) - 1, "windows_measured": len(errors),
            "window_error_pct": _spread(errors)}


def _spread(values: list[float]) -> dict[str, float] | None:
    """Mean, standard deviation and largest magnitude (None without values)."""
    if not values:
        return None
    array = np.array(values)
    return {"mean": float(array.mean()), "sd": float(array.std()), "max_abs": float(np.abs(array).max())}


def power_as_counter(updates: dict[str, Any], power: np.ndarray) -> dict[str, Any] | None:
    """How well the power field would stand in for the counter: its samples held until the next, integrated over
    windows of ``WINDOW_UPDATES`` counter updates and compared with the counter's energy over each (% of it), at
    the lag (ms, from -100 to 150) that gives the smallest spread in hindsight; ``updates``: the counter's
    (:func:`truth`). None without power samples."""
    usable = power[np.isfinite(power[:, 2])]
    if len(usable) < 2:
        return None
    times_s, energies_j = updates["times_s"], updates["energies_j"]
    middles_s = (usable[:, 0] + usable[:, 1]) / 2
    held_j = np.concatenate([[0.0], np.cumsum(usable[:-1, 2] / 1e3 * np.diff(middles_s))])
    edges = np.arange(0, len(times_s) - WINDOW_UPDATES, WINDOW_UPDATES)
    true_j = energies_j[edges + WINDOW_UPDATES] - energies_j[edges]
    best: dict[str, Any] | None = None
    for lag_ms in range(-100, 151, 10):
        at = np.interp(times_s + lag_ms / 1e3, middles_s, held_j)
        errors = 100 * ((at[edges + WINDOW_UPDATES] - at[edges]) - true_j) / true_j
        if best is None or errors.std() < best["sd"]:
            best = {"lag_ms": lag_ms, "windows": len(errors), **(_spread(list(errors)) or {}),
                    "read_ms": 1e3 * float(np.median(usable[:, 1] - usable[:, 0]))}
    return best


def replay(folder: Path, out: Path, label: str) -> None:
    """Every recorded workload of ``folder`` replayed through this kdvfs's trace into ``out`` (JSON)."""
    import kdvfs
    from kdvfs.runtime.device import update_clock

    runs = {path.stem: replay_one(np.load(path)["counter"]) for path in sorted(folder.glob("*.npz"))}
    out.write_text(json.dumps({"label": label, "kdvfs": str(Path(kdvfs.__file__).resolve().parent),
                               "drift_s_per_s": update_clock.DRIFT_S_PER_S,
                               "energy_read_every_s": MeasurementConfig().energy_read_every_s, "runs": runs},
                              indent=1))


def report(folder: Path, replays: list[Path], name: str) -> dict[str, Any]:
    """The recordings' clocks and power field, and the replays side by side, into ``benchmarks/results/NAME.*``."""
    counters = {}
    for path in sorted(folder.glob("*.npz")):
        data = np.load(path)
        updates = truth(data["counter"])
        clock = {k: v for k, v in updates.items() if not isinstance(v, np.ndarray)}
        counters[path.stem] = {"clock": clock, "power_field": power_as_counter(updates, data["power"])}
    command = (f"python -m benchmarks.h200.energy_reads record {folder} (on the GPU machine); replay {folder} "
               f"OUT.json --label L for each kdvfs; report {folder} {' '.join(str(p) for p in replays)} --name {name}")
    result = {"provenance": provenance(command), "device_run": json.loads((folder / "run.json").read_text()),
              "counters": counters, "replays": [json.loads(p.read_text()) for p in replays],
              "window_s": WINDOW_S, "block_s": BLOCK_S}
    write_results(name, result, markdown(result))
    return result


def _rate(blocks: list[dict[str, float]], key: str, later: bool) -> str:
    """A read rate of the first block, or the mean of the later ones (``-`` where there are none)."""
    values = [b[key] for b in (blocks[1:] if later else blocks[:1])]
    return f"{sum(values) / len(values):.2f}" if values else "-"


def markdown(result: dict[str, Any]) -> str:
    device = result["device_run"]
    lines = [f"# The energy counter read at its own pace, replayed on a recorded {device['gpu'].split(',')[0]}", "",
             *provenance_lines(result["provenance"]),
             f"- recorded: `{device['machine']}`, {device['started_utc']}, `{device['gpu']}`", "",
             "## The counter in hindsight (read back to back beside each training process)", "",
             "| workload | updates' period (ms) | residual (ms, sd) | change bracket (ms) | missed updates | "
             "drift (s/s: a 20 s fit's error at the end) | read (ms, median) | span (s) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, c in result["counters"].items():
        k = c["clock"]
        lines.append(f"| {label} | {1e3 * k['period_s']:.4f} | {1e3 * k['residual_sd_s']:.2f} | "
                     f"{1e3 * k['bracket_s']:.2f} | {k['missed_updates']} | {k['drift_s_per_s']:.1e} | "
                     f"{1e3 * k['read_s']:.2f} | {k['span_s']:.0f} |")
    lines += ["", f"## Replays ({result['window_s']:g} s windows; read rates in the first {result['block_s']:g} s, "
              "which holds the update clock's search, and after)", "",
              "| kdvfs | drift bound (s/s) | read every (s) | workload | reads/s | first block | after | "
              "of them relock, after | learning reads | window energy error % (mean, sd, max) |",
              "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in result["replays"]:
        for label, run in r["runs"].items():
            e = run["window_error_pct"] or {"mean": math.nan, "sd": math.nan, "max_abs": math.nan}
            lines.append(f"| {r['label']} | {r['drift_s_per_s']:g} | {r['energy_read_every_s']:g} | {label} | "
                         f"{run['reads_per_s']:.2f} | {_rate(run['per_block'], 'reads', False)} | "
                         f"{_rate(run['per_block'], 'reads', True)} | {_rate(run['per_block'], 'relock', True)} | "
                         f"{run['calibration_reads']} | {e['mean']:+.3f}, {e['sd']:.3f}, {e['max_abs']:.3f} "
                         f"({run['windows_measured']} of {run['windows']}) |")
    lines += ["", f"## The power field in the counter's place (windows of {WINDOW_UPDATES} updates, the best lag "
              "in hindsight)", "", "| workload | lag (ms) | windows | error % mean | sd | max | read (ms) |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, c in result["counters"].items():
        p = c["power_field"]
        if p:
            lines.append(f"| {label} | {p['lag_ms']} | {p['windows']} | {p['mean']:+.3f} | {p['sd']:.3f} | "
                         f"{p['max_abs']:.3f} | {p['read_ms']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("record", "replay", "report"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("files", type=Path, nargs="*", help="replay: OUT.json; report: the replays' files")
    parser.add_argument("--label", default="this checkout", help="replay: what the replayed kdvfs is")
    parser.add_argument("--name", default="energy_reads_h100", help="report: results file stem")
    args = parser.parse_args()
    if args.stage == "record":
        record(args.folder)
    elif args.stage == "replay":
        replay(args.folder, args.files[0], args.label)
    else:
        print(markdown(report(args.folder, args.files, args.name)))


if __name__ == "__main__":
    main()
