"""Read Nsight Compute ``--csv --page raw`` exports and enrich traces with their per-kernel counters.

Kernels are matched in order and by name: both sequences are reduced to base function names (no
namespaces, template arguments or parameters, so ``void at::native::foo<8>(char*)`` from Kineto and
``void native::foo<8>(char *)`` from ncu agree) and aligned with a longest-matching-blocks diff. ncu
replays kernels only, so memsets and memcpys are never matched; an export of the first N kernels
enriches the first N.
"""

from __future__ import annotations

import csv
import difflib
import io
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from kdvfs.common.errors import TraceFormatError
from kdvfs.common.files import read_input
from kdvfs.envs.trace.trace import Features, Kind, Trace

NAME_COLUMN = "Kernel Name"
SM_COLUMN = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_COLUMNS = ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                "dram__throughput.avg.pct_of_peak_sustained_elapsed")
TENSOR_COLUMNS = ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
                  "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active")
CLOCK_COLUMN = "gpc__cycles_elapsed.avg.per_second"
_MISSING = {"", "n/a", "no data", "N/A"}


@dataclass(frozen=True)
class NcuKernel:
    """Counters of one kernel from an ncu export (utilisations as fractions, clock in MHz)."""

    name: str
    sm_util: float
    dram_util: float
    tensor_util: float | None
    clock_mhz: float | None


def _value(cell: str, where: str) -> float | None:
    text = cell.strip().replace(",", "")
    if text in _MISSING:
        return None
    try:
        number = float(text)
    except ValueError:
        raise TraceFormatError(f"{where}: {cell!r} is not a number") from None
    if not math.isfinite(number):
        raise TraceFormatError(f"{where}: {cell!r} is not finite")
    return number


def _fraction(percent: float | None) -> float | None:
    return None if percent is None else min(1.0, max(0.0, percent / 100.0))


def parse_ncu_csv(text: str, where: str) -> list[NcuKernel]:
    """Parse the text of an ``ncu --csv --page raw`` export (log lines before the header are skipped).

    Raises:
        TraceFormatError: no header, a required column missing, a malformed row.
    """
    rows = list(csv.reader(io.StringIO(text)))
    header_at = next((i for i, r in enumerate(rows) if r and r[0] == "ID" and NAME_COLUMN in r), None)
    if header_at is None:
        raise TraceFormatError(f"{where}: no ncu header row (\"ID\",...,\"{NAME_COLUMN}\"); export with "
                               "`ncu --csv --page raw ...`")
    header = rows[header_at]
    dram = next((c for c in DRAM_COLUMNS if c in header), None)
    if SM_COLUMN not in header or dram is None:
        missing = [c for c in (SM_COLUMN,) if c not in header] + ([] if dram else [DRAM_COLUMNS[0]])
        raise TraceFormatError(f"{where}: missing column(s) {missing}; collect them with "
                               "`ncu --section SpeedOfLight --csv --page raw`")
    col = {name: i for i, name in enumerate(header)}
    tensor = next((c for c in TENSOR_COLUMNS if c in col), None)
    first = header_at + 1
    if first < len(rows) and rows[first] and rows[first][0] == "":
        first += 1  # the units row
    kernels = []
    for number, row in enumerate(rows[first:], start=first + 1):
        if not row:
            continue
        place = f"{where}: row {number}"
        if len(row) != len(header):
            raise TraceFormatError(f"{place}: {len(row)} cells, header has {len(header)}; the file is truncated")
        sm, dram_pct = _value(row[col[SM_COLUMN]], place), _value(row[col[dram]], place)
        if sm is None or dram_pct is None:
            raise TraceFormatError(f"{place}: no {SM_COLUMN if sm is None else dram} value")
        clock = _value(row[col[CLOCK_COLUMN]], place) if CLOCK_COLUMN in col else None
        kernels.append(NcuKernel(
            name=row[col[NAME_COLUMN]], sm_util=_fraction(sm) or 0.0, dram_util=_fraction(dram_pct) or 0.0,
            tensor_util=_fraction(_value(row[col[tensor]], place)) if tensor else None,
            clock_mhz=None if clock is None else clock / 1e6,
        ))
    if not kernels:
        raise TraceFormatError(f"{where}: the export holds no kernel rows")
    return kernels


def read_ncu_csv(path: Path) -> list[NcuKernel]:
    """Read an ncu raw CSV export (``.csv`` or ``.csv.gz``)."""
    return parse_ncu_csv(read_input(path, TraceFormatError), str(path))


_TEMPLATE = re.compile(r"<[^<>]*>")


def kernel_key(name: str) -> str:
    """Base function name of a kernel, equal across Kineto's and ncu's demangling styles."""
    text = name.replace("(anonymous namespace)", "").replace("<unnamed>", "")
    text = re.sub(r"^void\s+", "", text.strip())
    previous = None
    while previous != text:
        previous, text = text, _TEMPLATE.sub("", text)
    return text.split("(", 1)[0].split("::")[-1].strip()


def enrich_with_ncu(trace: Trace, counters: list[NcuKernel], source: str) -> tuple[Trace, int]:
    """Attach ncu counters to the trace's kernels matched in order and by name.

    Returns:
        The enriched trace (a new object) and the number of kernels that received features.
    """
    positions = [i for i, k in enumerate(trace.kernels) if k.kind is Kind.KERNEL]
    trace_keys = [kernel_key(trace.kernels[i].name) for i in positions]
    ncu_keys = [kernel_key(c.name) for c in counters]
    matcher = difflib.SequenceMatcher(None, trace_keys, ncu_keys, autojunk=False)
    kernels = list(trace.kernels)
    matched = 0
    for block in matcher.get_matching_blocks():
        for offset in range(block.size):
            c = counters[block.b + offset]
            index = positions[block.a + offset]
            features = Features(c.sm_util, c.dram_util, c.tensor_util, c.clock_mhz, f"ncu:{source}")
            kernels[index] = replace(kernels[index], features=features)
            matched += 1
    return replace(trace, kernels=tuple(kernels)), matched
