"""The cost model's error on real measurements: the residuals kdvfs's ranges are built from.

A residual is ``log(measured / predicted)`` of one figure (natural log of a ratio, so 0.05 is ~5%
under-predicted), keyed by the figure: ``step_time_s``, ``energy_j``, ``avg_power_w``. Three bodies of evidence
(``docs/design/cost-model.md``, Uncertainty): **level**, whole steps at their recorded clocks against NVML
(:func:`real_captures`, :func:`capture_residuals`); **clocks, fitted**, kernels at other clock pairs with the
parameters fitted 5-fold on the other kernels of the public sweeps (:func:`sweep_clock_residuals`); and
**transfer**, the same with every parameter fitted on the other sweep's GPU, watts scaled by
:data:`SWEEP_BOARD_POWER_W` (also at the reference row: :func:`transfer_level_residuals`). A GPU's own
per-kernel measurements at other clocks replace the fitted sweep residuals (RTX 3080 Ti:
:func:`table1_residuals`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.paths import BUNDLED_TRACE_DIR, DATA_DIR
from kdvfs.envs.calibration.fit import POWER_PARAMS, fit_params, predict_power_w, predict_time_s
from kdvfs.envs.calibration.optimum_fit import published_changes
from kdvfs.envs.calibration.published_optimum import load_published_optimum, table1_step
from kdvfs.envs.calibration.sweep import Sweep, load_sweep
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.cost_model import CostParams
from kdvfs.envs.model.cost_tables import build_tables, step_breakdown
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.trace import Trace, with_measured_gaps

FIGURES = ("step_time_s", "energy_j", "avg_power_w")
SWEEP_BOARD_POWER_W = {"gtx980": 165.0, "gtx1080ti": 250.0}
"""Board power (W) of the two public sweeps' GPUs (NVIDIA's specifications), whose ratio scales the watts of a
fit on one to the other, as ``scripts/derive_profile_estimates.py`` scales the H200's by the power-limit ratio."""
SWEEP_FOLDS = 5
MAX_UNKNOWN_SHARE = 0.5
WATT_PARAMS = tuple(name for name in POWER_PARAMS if name.endswith("_w"))


@dataclass(frozen=True)
class Residuals:
    """Residuals of each figure (``FIGURES`` keys, arrays of one length), with the label of each sample (a
    capture's trace name or a sweep kernel) and its group (a capture's model family, a sweep's GPU)."""

    values: Mapping[str, Array]
    labels: tuple[str, ...]
    groups: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.labels)

    def without(self, keep: Array) -> Residuals:
        """The samples where the boolean mask ``keep`` is True."""
        return Residuals({k: v[keep] for k, v in self.values.items()},
                         tuple(np.array(self.labels, dtype=object)[keep]),
                         tuple(np.array(self.groups, dtype=object)[keep]))

    @classmethod
    def joined(cls, parts: list[Residuals]) -> Residuals:
        return cls({k: np.concatenate([p.values[k] for p in parts]) for k in parts[0].values},
                   sum((p.labels for p in parts), ()), sum((p.groups for p in parts), ()))


def real_captures(profile: GpuProfile, folder: Path = BUNDLED_TRACE_DIR) -> list[tuple[str, Trace]]:
    """Every trace under ``folder/<profile name>/`` (any depth) recorded on the profile's GPU with a measured
    unprofiled step time and joules per step, as ``(name, trace)`` sorted by name (the path below ``folder``
    without the file suffix). Left out: traces without a measured step time (their profiled gaps are no check
    of a step's joules) and those with more than :data:`MAX_UNKNOWN_SHARE` of their kernel time in kernels with
    neither counters nor the op that launched them (:func:`unknown_share`), predicted from kernel names alone,
    which no ``kdvfs capture`` produces."""
    captures = []
    for path in sorted((folder / profile.name).rglob("*.trace.json*")):
        trace = load_trace(path)
        measured = trace.meta.measurements
        if ({"step_time_s", "energy_j_per_step"} <= measured.keys() and profile.applies_to(trace.meta.gpu)
                and unknown_share(trace) <= MAX_UNKNOWN_SHARE):
            captures.append((path.relative_to(folder).as_posix().split(".trace.json")[0], trace))
    return captures


def unknown_share(trace: Trace) -> float:
    """Share of a step's kernel time in kernels with neither counters (``features``) nor their launching op."""
    durations = np.array([k.duration_s for k in trace.kernels])
    unknown = np.array([k.features is None and k.op is None for k in trace.kernels])
    return float(durations[unknown].sum() / durations.sum())


def family(trace: Trace) -> str:
    """The model family of a capture: its workload label up to the first ``-`` (``llama-b8-s512``: llama)."""
    return trace.meta.workload.split("-")[0]


def auto_prediction(trace: Trace, profile: GpuProfile) -> dict[str, float]:
    """``kdvfs predict``'s auto row of a trace (gaps scaled to its measured step time): the ``FIGURES``."""
    step = with_measured_gaps(trace)
    tables = build_tables(step, profile)
    row = step_breakdown(step, tables, tables.auto_time_s[:, 0], tables.auto_energy_j[:, 0],
                         tables.auto_gap_power_w[:, 0])
    return {figure: float(row[figure]) for figure in FIGURES}


def capture_residuals(profile: GpuProfile, captures: list[tuple[str, Trace]]) -> Residuals:
    """Level residuals of each capture: measured step time, joules per step and their ratio (average power)
    against the auto prediction."""
    values: dict[str, list[float]] = {figure: [] for figure in FIGURES}
    for _, trace in captures:
        predicted, measured = auto_prediction(trace, profile), trace.meta.measurements
        time_s, energy_j = measured["step_time_s"], measured["energy_j_per_step"]
        for figure, value in zip(FIGURES, (time_s, energy_j, energy_j / time_s), strict=True):
            values[figure].append(float(np.log(value / predicted[figure])))
    return Residuals({k: np.array(v) for k, v in values.items()}, tuple(name for name, _ in captures),
                     tuple(family(trace) for _, trace in captures))


def public_sweeps() -> dict[str, Sweep]:
    """The public per-kernel sweeps in the kdvfs schema (``data/sweeps``), by GPU."""
    return {gpu: load_sweep(DATA_DIR / "sweeps" / f"{gpu}.sweep.csv") for gpu in SWEEP_BOARD_POWER_W}


def _predicted(params: CostParams, sweep: Sweep, reference_power: bool) -> tuple[Array, Array]:
    """(R,) predicted time (s) and power (W) of every row of ``sweep`` from its kernel's reference row."""
    time_s = predict_time_s(params, sweep)
    return time_s, predict_power_w(params, sweep, time_s, reference_power)


def _out_of_fold(sweep: Sweep, seed: int) -> tuple[Array, Array]:
    """Every row's prediction with parameters fitted without its kernel (``SWEEP_FOLDS``-fold by kernel)."""
    time_s, power_w = np.empty(len(sweep.time_s)), np.empty(len(sweep.time_s))
    order = np.random.default_rng(seed).permutation(len(sweep.kernel_names))
    for held_out in np.array_split(order, SWEEP_FOLDS):
        params = fit_params(sweep.subset(np.setdiff1d(np.arange(len(sweep.kernel_names)), held_out)))
        rows = np.isin(sweep.kernel_index, held_out)
        test = sweep.subset(np.sort(held_out))
        time_s[rows], power_w[rows] = _predicted(params, test, reference_power=True)
    return time_s, power_w


def pair_residuals(sweep: Sweep, gpu: str, time_s: Array, power_w: Array) -> Residuals:
    """Clock residuals of a sweep as steps: at each clock pair where at least half of the kernels were measured
    (their own reference rows left out), the measured against the predicted mean over those kernels of each
    one's time and energy relative to its reference row (every kernel weighing as one unit of reference time or
    energy), so kernel errors net out as they do over a step that runs many kernels at one pair."""
    rows = np.arange(len(sweep.time_s))
    reference = sweep.reference_rows[sweep.kernel_index]
    energy_j = sweep.time_s * sweep.power_w
    values: dict[str, list[float]] = {figure: [] for figure in FIGURES}
    labels = []
    for core, mem in sorted(set(zip(sweep.core_mhz.tolist(), sweep.mem_mhz.tolist(), strict=True))):
        at = (sweep.core_mhz == core) & (sweep.mem_mhz == mem) & (rows != reference)
        if 2 * at.sum() < len(sweep.kernel_names):
            continue
        log_time = np.log(np.mean(sweep.time_s[at] / sweep.time_s[reference[at]])
                          / np.mean(time_s[at] / sweep.time_s[reference[at]]))
        log_energy = np.log(np.mean(energy_j[at] / energy_j[reference[at]])
                            / np.mean(time_s[at] * power_w[at] / energy_j[reference[at]]))
        for figure, value in zip(FIGURES, (log_time, log_energy, log_energy - log_time), strict=True):
            values[figure].append(float(value))
        labels.append(f"{gpu}:{core:g}:{mem:g}")
    return Residuals({k: np.array(v) for k, v in values.items()}, tuple(labels), (gpu,) * len(labels))


def transferred(params: CostParams, source: str, target: str) -> CostParams:
    """Parameters fitted on ``source``'s sweep carried to ``target``: watts scaled by the board-power ratio."""
    scale = SWEEP_BOARD_POWER_W[target] / SWEEP_BOARD_POWER_W[source]
    return replace(params, **{name: getattr(params, name) * scale for name in WATT_PARAMS})


def _transfers() -> list[tuple[str, Sweep, CostParams]]:
    """Each public sweep with the parameters fitted on the other one, carried to it (:func:`transferred`)."""
    sweeps = public_sweeps()
    fits = {gpu: fit_params(sweep) for gpu, sweep in sweeps.items()}
    return [(target, sweeps[target], transferred(fits[source], source, target))
            for source in sweeps for target in sweeps if target != source]


def sweep_clock_residuals(transfer: bool, seed: int = 0) -> Residuals:
    """Clock residuals of the public sweeps by clock pair (:func:`pair_residuals`), each kernel predicted from
    its reference row (its measured power there an input) with parameters fitted on the other kernels of the
    same sweep (``SWEEP_FOLDS``-fold, ``seed`` orders the folds), or (``transfer``) on the other GPU's sweep."""
    if transfer:
        return Residuals.joined([pair_residuals(sweep, gpu, *_predicted(params, sweep, reference_power=True))
                                 for gpu, sweep, params in _transfers()])
    return Residuals.joined([pair_residuals(sweep, gpu, *_out_of_fold(sweep, seed))
                             for gpu, sweep in public_sweeps().items()])


def transfer_level_residuals() -> Residuals:
    """Level residuals of a transferred profile: each public-sweep kernel at its reference row, its power from
    its utilisations alone with the other GPU's parameters (:func:`transferred`). Kernel by kernel (two GPUs
    give two step-level values): wider than a step's. The reference duration is an input, so the time residual
    is 0: a step's time at its recorded clocks is the trace's own."""
    parts = []
    for gpu, sweep, params in _transfers():
        time_s, power_w = _predicted(params, sweep, reference_power=False)
        at = sweep.reference_rows
        log_time, log_power = np.log(sweep.time_s[at] / time_s[at]), np.log(sweep.power_w[at] / power_w[at])
        kernels = tuple(f"{gpu}:{name}" for name in sweep.kernel_names)
        parts.append(Residuals({"step_time_s": log_time, "energy_j": log_time + log_power, "avg_power_w": log_power},
                               kernels, (gpu,) * len(kernels)))
    return Residuals.joined(parts)


def table1_residuals(profile: GpuProfile) -> Residuals:
    """Clock residuals of the Table 1 kernels of arXiv 2601.08539 the ``rtx3080ti`` profile was not fitted on:
    each kernel's published time and energy change at its published pair against the model's (as
    ``benchmarks/model/rtx3080ti_table1.py`` computes them)."""
    every = load_published_optimum()
    time_pct, energy_pct = published_changes(CostParams.from_profile(profile), profile, table1_step(profile), every)
    held_out = np.array([not row.fitted for row in every])
    rows = tuple(row for row in every if not row.fitted)
    log_time = np.log1p(np.array([r.time_pct for r in rows]) / 100) - np.log1p(time_pct[held_out] / 100)
    log_energy = np.log1p(np.array([r.energy_pct for r in rows]) / 100) - np.log1p(energy_pct[held_out] / 100)
    return Residuals({"step_time_s": log_time, "energy_j": log_energy, "avg_power_w": log_energy - log_time},
                     tuple(f"{r.index}:{r.kernel}" for r in rows), (profile.name,) * len(rows))


def _body(source: str, residuals: Residuals, figures: Mapping[str, Array] | None = None) -> dict[str, Any]:
    """One body of evidence as the model-error file holds it: residuals rounded to 1e-5, with their labels."""
    values = residuals.values if figures is None else figures
    return {"source": source, "figures": {k: [round(float(v), 5) for v in values[k]] for k in FIGURES},
            "labels": list(residuals.labels), "groups": list(residuals.groups)}


SWEEPS = "public sweeps (GTX 980, GTX 1080 Ti)"
FITTED_SOURCE = (f"{SWEEPS} by clock pair: the kernels' mean change against their reference, each kernel predicted "
                 f"with parameters fitted without it ({SWEEP_FOLDS}-fold)")
TRANSFER_SOURCE = (f"{SWEEPS} by clock pair: the kernels' mean change against their reference, every parameter "
                   "fitted on the other GPU's sweep")
TABLE1_SOURCE = ("the kernels of arXiv 2601.08539 Table 1 the profile was not fitted on: time and energy change at "
                 "the published pair, kernel by kernel")


def model_error_document(captured: GpuProfile, table1: GpuProfile) -> dict[str, Any]:
    """The evidence of ``configs/model_error.json`` (without its provenance): ``captured``'s real captures, the
    public sweeps fitted and transferred, and ``table1``'s (the RTX 3080 Ti profile's) held-out Table 1 kernels.
    Deterministic (fixed fold order)."""
    captures = real_captures(captured)
    level, transfer_level = capture_residuals(captured, captures), transfer_level_residuals()
    families = ", ".join(sorted({family(trace) for _, trace in captures}))
    steps = f"{len(captures)} real {captured.model} steps"
    return {
        "level": {
            captured.name: _body(f"{steps} bundled with kdvfs ({families}) at auto: NVML joules and unprofiled "
                                 "seconds per step against `kdvfs predict`", level),
            "transfer": _body(f"{SWEEPS}: each kernel at its reference clocks, power from utilisations alone with the "
                              f"other GPU's parameters, kernel by kernel; step time: the {steps}' (a step's time at "
                              "its recorded clocks is the trace's own)", transfer_level,
                              {**transfer_level.values, "step_time_s": level.values["step_time_s"]}),
        },
        "clocks": {
            "fitted": _body(FITTED_SOURCE, sweep_clock_residuals(transfer=False)),
            "transfer": _body(TRANSFER_SOURCE, sweep_clock_residuals(transfer=True)),
            table1.name: _body(f"{table1.model}: {TABLE1_SOURCE}", table1_residuals(table1)),
        },
    }
