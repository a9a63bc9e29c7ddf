"""Save and load traces in the kdvfs trace format (JSON, one kernel per line, optionally gzipped).

Format ``kdvfs-trace`` version 1, specified in ``docs/design/trace-format.md``: a header (``format``,
``version``, ``meta`` with the GPU, workload, reference clocks, measurements, step shapes and the optional
power-limit fields), tables of kernel names, ops and feature sources referenced by index, ``columns`` and one
row per kernel, so a diff of two traces shows one changed kernel as one changed line. Times are in seconds.
A file of another format or version, or malformed, is refused with a one-line ``TraceFormatError``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from kdvfs.common.errors import TraceFormatError
from kdvfs.common.files import read_input, write_text_atomic
from kdvfs.envs.trace.shape import StepShape
from kdvfs.envs.trace.trace import Category, Features, Kernel, Kind, OpInfo, Phase, Trace, TraceMeta

T = TypeVar("T")
FORMAT_NAME = "kdvfs-trace"
FORMAT_VERSION = 1
COLUMNS = (
    "name", "kind", "category", "phase", "duration_s", "gap_before_s", "grid", "block", "op",
    "flops", "dram_bytes", "sm_util", "dram_util", "tensor_util", "clock_mhz", "features_source",
)
_META_FIELDS = ("gpu", "workload", "source", "ref_mem_mhz", "ref_core_mhz", "observed_core_mhz",
                "step_index", "measurements", "step_shape", "shape_distribution")
_OPTIONAL_META_FIELDS = ("power_limit_w", "power_limit_range_w")
"""Meta fields written only when set (traces from before them stay byte-identical)."""


class _Interner:
    def __init__(self) -> None:
        self.index: dict[Any, int] = {}

    def __call__(self, value: Any) -> int:
        return self.index.setdefault(value, len(self.index))

    def table(self) -> list[Any]:
        return list(self.index)


def _meta_to_json(meta: TraceMeta) -> dict[str, Any]:
    record = {name: getattr(meta, name) for name in _META_FIELDS}
    record["measurements"] = dict(meta.measurements)
    record["step_shape"] = None if meta.step_shape is None else meta.step_shape.to_json()
    record["shape_distribution"] = [{"step_shape": shape.to_json(), "steps": steps}
                                    for shape, steps in meta.shape_distribution]
    if meta.step_shape is None and not meta.shape_distribution:  # traces without shapes stay as they were
        del record["step_shape"], record["shape_distribution"]
    if meta.power_limit_w is not None:
        record["power_limit_w"] = meta.power_limit_w
    if meta.power_limit_range_w is not None:
        record["power_limit_range_w"] = list(meta.power_limit_range_w)
    return record


def dumps_trace(trace: Trace) -> str:
    """Serialise a trace to the kdvfs trace format (a string)."""
    names, ops, sources = _Interner(), _Interner(), _Interner()
    rows = []
    for k in trace.kernels:
        f = k.features
        rows.append([
            names(k.name), k.kind.value, k.category.value, k.phase.value, k.duration_s, k.gap_before_s,
            list(k.grid), list(k.block), None if k.op is None else ops(k.op), k.flops, k.dram_bytes,
            f and f.sm_util, f and f.dram_util, f and f.tensor_util, f and f.clock_mhz,
            None if f is None else sources(f.source),
        ])
    op_table = [{"name": o.name, "dims": [list(d) for d in o.input_dims], "types": list(o.input_types)}
                for o in ops.table()]
    head = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "meta": _meta_to_json(trace.meta),
            "names": names.table(), "ops": op_table, "sources": sources.table(), "columns": list(COLUMNS)}
    head_text = json.dumps(head, indent=1, allow_nan=False)[:-2]
    body = ",\n".join(json.dumps(row, allow_nan=False, separators=(",", ":")) for row in rows)
    return f'{head_text},\n "kernels": [\n{body}\n ]\n}}\n'


def save_trace(trace: Trace, path: Path) -> None:
    """Write a trace atomically to ``path`` (gzip when the name ends in ``.gz``)."""
    write_text_atomic(Path(path), dumps_trace(trace))


def _require(condition: bool, where: str, message: str) -> None:
    if not condition:
        raise TraceFormatError(f"{where}: {message}")


def _number(value: Any, where: str, label: str, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    _require(isinstance(value, int | float) and not isinstance(value, bool) and abs(value) <= sys.float_info.max,
             where, f"{label}={value!r:.40} is not a finite number")
    return float(value)


def _dim3(value: Any, where: str, label: str) -> tuple[int, int, int]:
    _require(isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) for v in value),
             where, f"{label}={value!r} is not three integers")
    return (value[0], value[1], value[2])


def _enum(enum_type: Any, value: Any, where: str, label: str) -> Any:
    try:
        return enum_type(value)
    except ValueError:
        allowed = ", ".join(e.value for e in enum_type)
        raise TraceFormatError(f"{where}: {label}={value!r} is not one of {allowed}") from None


def _lookup(table: Sequence[Any], index: Any, where: str, label: str) -> Any:
    _require(isinstance(index, int) and 0 <= index < len(table), where, f"{label} index {index!r} out of range")
    return table[index]


def _parse_op(record: Any, where: str) -> OpInfo:
    _require(isinstance(record, dict) and isinstance(record.get("name"), str), where, "malformed op entry")
    dims, types = record.get("dims", []), record.get("types", [])
    _require(isinstance(dims, list) and all(isinstance(d, list) for d in dims), where,
             f"dims={dims!r:.60} is not a list of lists")
    _require(isinstance(types, list) and all(isinstance(t, str) for t in types), where,
             f"types={types!r:.60} is not a list of strings")
    return OpInfo(record["name"], tuple(tuple(d) for d in dims), tuple(types))


def _located(where: str, build: Callable[..., T], *args: Any) -> T:
    """``build(*args)``, its TraceFormatError prefixed with ``where`` (once)."""
    try:
        return build(*args)
    except TraceFormatError as error:
        message = str(error)
        raise TraceFormatError(message if message.startswith(where) else f"{where}: {message}") from None


def _build_kernel(row: Any, tables: dict[str, list[Any]], where: str) -> Kernel:
    _require(isinstance(row, list) and len(row) == len(COLUMNS), where,
             f"expected a list of {len(COLUMNS)} values ({', '.join(COLUMNS)})")
    v = dict(zip(COLUMNS, row, strict=True))
    features = None
    if v["features_source"] is not None:
        sm, dram = _number(v["sm_util"], where, "sm_util", False), _number(v["dram_util"], where, "dram_util", False)
        features = Features(sm_util=sm or 0.0, dram_util=dram or 0.0,
                            tensor_util=_number(v["tensor_util"], where, "tensor_util"),
                            clock_mhz=_number(v["clock_mhz"], where, "clock_mhz"),
                            source=_lookup(tables["sources"], v["features_source"], where, "features_source"))
    return Kernel(
        name=_lookup(tables["names"], v["name"], where, "name"),
        kind=_enum(Kind, v["kind"], where, "kind"),
        category=_enum(Category, v["category"], where, "category"),
        phase=_enum(Phase, v["phase"], where, "phase"),
        duration_s=_number(v["duration_s"], where, "duration_s", False) or 0.0,
        gap_before_s=_number(v["gap_before_s"], where, "gap_before_s", False) or 0.0,
        grid=_dim3(v["grid"], where, "grid"), block=_dim3(v["block"], where, "block"),
        op=None if v["op"] is None else _lookup(tables["ops"], v["op"], where, "op"),
        flops=_number(v["flops"], where, "flops"), dram_bytes=_number(v["dram_bytes"], where, "dram_bytes"),
        features=features,
    )


def _parse_meta(record: Any, where: str) -> TraceMeta:
    _require(isinstance(record, dict), where, "'meta' must be an object")
    unknown = set(record) - set(_META_FIELDS) - set(_OPTIONAL_META_FIELDS)
    _require(not unknown, where, f"unknown meta fields {sorted(unknown)}")
    for key in ("gpu", "workload", "source"):
        _require(isinstance(record.get(key), str), where, f"meta.{key} must be a string")
    measurements = record.get("measurements") or {}
    _require(isinstance(measurements, dict), where, "meta.measurements must be an object")
    step_index = record.get("step_index")
    _require(step_index is None or isinstance(step_index, int), where, "meta.step_index must be an integer")
    shape = record.get("step_shape")
    distribution = record.get("shape_distribution") or []
    _require(isinstance(distribution, list) and all(isinstance(entry, dict) and set(entry) == {"step_shape", "steps"}
                                                    and isinstance(entry["steps"], int) for entry in distribution),
             where, "meta.shape_distribution must be a list of {\"step_shape\": [...], \"steps\": N}")
    return TraceMeta(
        gpu=record["gpu"], workload=record["workload"], source=record["source"],
        ref_mem_mhz=_number(record.get("ref_mem_mhz"), where, "ref_mem_mhz"),
        ref_core_mhz=_number(record.get("ref_core_mhz"), where, "ref_core_mhz"),
        observed_core_mhz=_number(record.get("observed_core_mhz"), where, "observed_core_mhz"),
        step_index=step_index,
        measurements={str(k): _number(x, where, f"measurements.{k}", False) or 0.0 for k, x in measurements.items()},
        step_shape=None if shape is None else StepShape.from_json(shape),
        shape_distribution=tuple((StepShape.from_json(entry["step_shape"]), entry["steps"])
                                 for entry in distribution),
        power_limit_w=_number(record.get("power_limit_w"), where, "power_limit_w"),
        power_limit_range_w=_power_range(record.get("power_limit_range_w"), where),
    )


def _power_range(value: Any, where: str) -> tuple[float, float] | None:
    """``meta.power_limit_range_w``: absent, or two finite numbers (W)."""
    if value is None:
        return None
    _require(isinstance(value, list) and len(value) == 2, where, "meta.power_limit_range_w must be [low, high] in W")
    low, high = (_number(v, where, "power_limit_range_w", False) or 0.0 for v in value)
    return low, high


def loads_trace(text: str, where: str = "<string>") -> Trace:
    """Parse the kdvfs trace format. ``where`` names the source in error messages."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise TraceFormatError(f"{where}: not valid JSON ({error.msg} at line {error.lineno}); the file is "
                               "corrupt or truncated: re-create it with `kdvfs trace import`") from None
    _require(isinstance(document, dict) and document.get("format") == FORMAT_NAME, where,
             f"not a kdvfs trace (no \"format\": \"{FORMAT_NAME}\"); import profiler traces with `kdvfs trace import`")
    _require(document.get("version") == FORMAT_VERSION, where,
             f"trace format version {document.get('version')!r} is not supported (this kdvfs reads version "
             f"{FORMAT_VERSION}); re-import the trace with this version of kdvfs")
    _require(document.get("columns") == list(COLUMNS), where, f"columns must be {list(COLUMNS)}")
    for key in ("names", "ops", "sources", "kernels"):
        _require(isinstance(document.get(key), list), where, f"'{key}' must be a list")
    for key in ("names", "sources"):
        _require(all(isinstance(text, str) for text in document[key]), where, f"'{key}' must be a list of strings")
    tables = {"names": document["names"], "sources": document["sources"],
              "ops": [_located(f"{where}: ops[{i}]", _parse_op, op, f"{where}: ops[{i}]")
                      for i, op in enumerate(document["ops"])]}
    kernels = [_located(f"{where}: kernels[{i}]", _build_kernel, row, tables, f"{where}: kernels[{i}]")
               for i, row in enumerate(document["kernels"])]
    try:
        return Trace(meta=_parse_meta(document.get("meta"), where), kernels=tuple(kernels))
    except TraceFormatError as error:
        raise TraceFormatError(f"{where}: {error}") from None


def load_trace(path: Path) -> Trace:
    """Load a kdvfs trace file (``.json`` or ``.json.gz``)."""
    text = read_input(path, TraceFormatError, "check the path or list bundled traces with `kdvfs trace list`")
    return loads_trace(text, str(path))
