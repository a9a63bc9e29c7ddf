"""Measurement sweeps: per-kernel time and power at one or more clock pairs, in one documented schema.

A sweep is a CSV file with one row per (kernel, clock pair) and the columns

| column | unit | meaning |
| --- | --- | --- |
| ``kernel`` | | kernel identity (any string; rows with the same value are one kernel) |
| ``core_mhz``, ``mem_mhz`` | MHz | the clock pair the row was measured at (the observed clock in auto mode) |
| ``time_s`` | s | duration of one kernel execution, > 0 |
| ``power_w`` | W | average board power while the kernel ran, > 0 |
| ``sm_util``, ``dram_util`` | fraction | SM throughput and DRAM throughput as fractions of peak |
| ``tensor_util`` | fraction | optional: tensor-pipe utilisation |

Each kernel's *reference* row is its row at the highest memory clock and, among those, the highest core
clock; the model predicts every other row of the kernel from the reference row's time and utilisations.
Utilisations of non-reference rows are ignored.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.errors import KdvfsError
from kdvfs.common.files import read_input
from kdvfs.common.paths import SWEEP_DIR
from kdvfs.common.resolve import resolve_shipped
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.cost_model import ClockLimits, KernelInputs

SWEEP_SUFFIX = ".sweep.csv"
REQUIRED_COLUMNS = ("kernel", "core_mhz", "mem_mhz", "time_s", "power_w", "sm_util", "dram_util")
OPTIONAL_COLUMNS = ("tensor_util",)


class SweepError(KdvfsError):
    """A sweep file is missing columns, holds invalid values, or cannot support a fit."""


@dataclass(frozen=True)
class Sweep:
    """Rows of a sweep as arrays. R rows, J kernels.

    Attributes:
        source: file the sweep came from.
        kernel_names: (J,) kernel identities.
        kernel_index: (R,) row -> kernel.
        core_mhz, mem_mhz, time_s, power_w: (R,) per-row measurements.
        sm_util, dram_util, tensor_util: (R,) per-row utilisations (only reference rows are used).
        grid_limits: the maximum clocks the model normalises by; None means the sweep's own grid maxima.
            Subsets keep their parent's, and a calibration uses the GPU profile's.
    """

    source: str
    kernel_names: tuple[str, ...]
    kernel_index: Array
    core_mhz: Array
    mem_mhz: Array
    time_s: Array
    power_w: Array
    sm_util: Array
    dram_util: Array
    tensor_util: Array
    grid_limits: ClockLimits | None = None

    @property
    def reference_rows(self) -> Array:
        """(J,) index of each kernel's reference row (highest memory clock, then highest core clock)."""
        order = np.lexsort((self.core_mhz, self.mem_mhz, self.kernel_index))
        last_of_kernel = np.r_[self.kernel_index[order][1:] != self.kernel_index[order][:-1], True]
        return order[last_of_kernel]

    @property
    def limits(self) -> ClockLimits:
        """Maximum core and memory clocks the model normalises by (see ``grid_limits``)."""
        return self.grid_limits or ClockLimits(float(self.core_mhz.max()), float(self.mem_mhz.max()))

    def row_inputs(self) -> KernelInputs:
        """(R,) model inputs: each row's kernel with its reference time, clocks and utilisations."""
        ref = self.reference_rows[self.kernel_index]
        return KernelInputs(self.time_s[ref], self.core_mhz[ref], self.mem_mhz[ref], self.sm_util[ref],
                            self.dram_util[ref], self.tensor_util[ref], self.power_w[ref])

    def row_inputs_without_power(self) -> KernelInputs:
        """As :meth:`row_inputs`, with the reference power unknown (utilisations only)."""
        k = self.row_inputs()
        return KernelInputs(k.time_s, k.core_mhz, k.mem_mhz, k.sm_util, k.dram_util, k.tensor_util,
                            np.full(len(k.time_s), np.nan))

    def subset(self, kernels: Array) -> Sweep:
        """The rows of the given kernel indices, kernels renumbered 0..len(kernels)-1."""
        keep = np.isin(self.kernel_index, kernels)
        renumber = np.full(len(self.kernel_names), -1)
        renumber[kernels] = np.arange(len(kernels))
        return Sweep(self.source, tuple(self.kernel_names[i] for i in kernels), renumber[self.kernel_index[keep]],
                     self.core_mhz[keep], self.mem_mhz[keep], self.time_s[keep], self.power_w[keep],
                     self.sm_util[keep], self.dram_util[keep], self.tensor_util[keep], self.limits)

    def check_clocks(self, profile: GpuProfile) -> None:
        """Raise if a row's clock pair is not supported by ``profile``."""
        supported = {(int(c), int(m)) for c, m in profile.clock_pairs_mhz}
        for row, (core, mem) in enumerate(zip(self.core_mhz, self.mem_mhz, strict=True)):
            if (int(core), int(mem)) not in supported:
                raise SweepError(f"{self.source}: row {row + 2}: clock pair ({core:g}, {mem:g}) MHz is not supported "
                                 f"by GPU profile {profile.name!r}; check the profile or the sweep's GPU")


def _cell(value: str, where: str, column: str, positive: bool) -> float:
    try:
        number = float(value)
    except ValueError:
        raise SweepError(f"{where}: column {column!r}: {value!r} is not a number") from None
    if not math.isfinite(number):
        raise SweepError(f"{where}: column {column!r} is {value}; remove or re-measure that row")
    if positive and number <= 0:
        raise SweepError(f"{where}: column {column!r} must be > 0, got {number:g}")
    if column.endswith("_util") and not 0.0 <= number <= 1.0:
        raise SweepError(f"{where}: column {column!r} must be a fraction in [0, 1], got {number:g}")
    return number


def parse_sweep(text: str, source: str) -> Sweep:
    """Parse sweep CSV text; ``source`` names the file in errors."""
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise SweepError(f"{source}: missing column(s) {missing}; a sweep needs {list(REQUIRED_COLUMNS)} "
                         "(see docs/design/cost-model.md, 'Sweep schema')")
    names: dict[str, int] = {}
    index, values = [], []
    numeric = [c for c in (*REQUIRED_COLUMNS[1:], *OPTIONAL_COLUMNS) if c in header]
    for row in reader:
        where = f"{source}: row {reader.line_num}"
        if not row.get("kernel"):
            raise SweepError(f"{where}: empty 'kernel'")
        index.append(names.setdefault(row["kernel"], len(names)))
        values.append([_cell(row[c] or "", where, c, c in ("core_mhz", "mem_mhz", "time_s", "power_w"))
                       for c in numeric])
    if not values:
        raise SweepError(f"{source}: no rows")
    table = dict(zip(numeric, np.asarray(values, dtype=np.float64).T, strict=True))
    if len({(c, m) for c, m in zip(table["core_mhz"], table["mem_mhz"], strict=True)}) < 2:
        raise SweepError(f"{source}: every row is at one clock pair; nothing to fit: measure at least two pairs "
                         "(or several kernels in auto mode at their own clocks)")
    return Sweep(source, tuple(names), np.asarray(index), table["core_mhz"], table["mem_mhz"], table["time_s"],
                 table["power_w"], table["sm_util"], table["dram_util"],
                 table.get("tensor_util", np.zeros(len(values))))


def sweep_path(name_or_path: str | Path) -> Path:
    """A sweep file path, or the path of a bundled sweep named ``gtx980`` (``data/sweeps/<name>.sweep.csv`` of
    the installation); neither is a :class:`SweepError` listing the bundled ones."""
    return resolve_shipped(name_or_path, SWEEP_DIR, SWEEP_SUFFIX, "sweep", error=SweepError)


def load_sweep(name_or_path: str | Path) -> Sweep:
    """Read a sweep CSV (``.csv`` or ``.csv.gz``) or a bundled sweep by name (:func:`sweep_path`)."""
    path = sweep_path(name_or_path)
    return parse_sweep(read_input(path, SweepError), str(path))


def sweep_to_csv(sweep: Sweep) -> str:
    """Serialise a sweep in the schema (used by the converters)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow((*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS))
    for row in range(len(sweep.time_s)):
        numbers = (sweep.core_mhz[row], sweep.mem_mhz[row], sweep.time_s[row], sweep.power_w[row],
                   sweep.sm_util[row], sweep.dram_util[row], sweep.tensor_util[row])
        writer.writerow([sweep.kernel_names[sweep.kernel_index[row]], *(repr(float(v)) for v in numbers)])
    return out.getvalue()
