"""Coverage of kdvfs's 90% ranges, each measurement held out of the evidence its own range is built from.

On the repository's real H200 captures: each capture's measured joules (and seconds, watts) per step against the
range ``kdvfs predict`` gives its auto row with that capture's residual left out of the level evidence (and, the
harder case, with its whole model family left out). On the public sweeps and the RTX 3080 Ti's Table 1: each
clock pair's (kernel's) residual against the range built from the others, and, for the sweeps, from the other
GPU alone. Also the ranges the product ships on the H200 GPT-3 XL step and on the B200 (no data of its own), and
whether the shipped ``configs/model_error.json`` is reproduced from the data. Writes
``benchmarks/results/uncertainty_coverage.json`` and ``.md``. From the repository root:

    python -m benchmarks.model.uncertainty_coverage
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import beta

from benchmarks.common.provenance import provenance, provenance_lines, write_results
from kdvfs.agents.common.problem import Problem
from kdvfs.agents.evaluation.compare import compare
from kdvfs.agents.evaluation.ranges import row_ranges
from kdvfs.envs.calibration.residuals import (
    FIGURES,
    Residuals,
    auto_prediction,
    capture_residuals,
    real_captures,
    sweep_clock_residuals,
    table1_residuals,
    transfer_level_residuals,
)
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.model_error import MODEL_ERROR_PATH, Evidence, RangeBasis, range_basis
from kdvfs.envs.model.ranges import COVERAGE, level_range, log_bounds
from kdvfs.envs.model.uncertainty import UncertaintySpec
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.trace import with_measured_gaps
from kdvfs.runtime.cli.offline.predict import predictions, with_ranges

TARGET = (0.85, 0.95)
EXAMPLE_TRACE = "h200/gpt3xl-24layer-b4"
EXAMPLE_METHODS = ("static", "latency-optimal")


def coverage(hits: Sequence[bool]) -> dict[str, Any]:
    """Share of ``hits`` that are True, with its exact (Clopper-Pearson) 95% interval."""
    n, k = len(hits), int(sum(hits))
    low = float(beta.ppf(0.025, k, n - k + 1)) if k > 0 else 0.0
    high = float(beta.ppf(0.975, k + 1, n - k)) if k < n else 1.0
    return {"covered": k, "n": n, "share": k / n if n else float("nan"), "interval_95": [low, high]}


def held_out_hits(values: np.ndarray, groups: Sequence[str]) -> list[bool]:
    """For each residual, whether it lies inside the range (``log_bounds`` of the residuals in full) built from
    the residuals of the *other* groups."""
    groups_array = np.array(groups, dtype=object)
    return [bool(low <= value <= high) for value, group in zip(values, groups, strict=True)
            for low, high in [log_bounds(np.zeros(1), [(values[groups_array != group], 1.0)])]]


def _evidence_without(residuals: Residuals, keep: np.ndarray) -> Evidence:
    return Evidence("held-out", "the captures but the held-out", {f: residuals.values[f][keep] for f in FIGURES})


def capture_coverage() -> dict[str, Any]:
    """The H200 captures: each one's measured figures against its auto row's range without its own residual
    (leave one capture out) and without its family's (leave one family out)."""
    profile = load_profile("h200")
    captures = real_captures(profile)
    residuals = capture_residuals(profile, captures)
    basis = range_basis(profile)
    rows, hits = [], {(scheme, f): [] for scheme in ("capture", "family") for f in FIGURES}
    for index, (name, trace) in enumerate(captures):
        predicted, measured = auto_prediction(trace, profile), trace.meta.measurements
        time_s, energy_j = measured["step_time_s"], measured["energy_j_per_step"]
        actual = dict(zip(FIGURES, (time_s, energy_j, energy_j / time_s), strict=True))
        row: dict[str, Any] = {"trace": name, "family": residuals.groups[index], "measured": actual,
                               "predicted": predicted}
        for scheme, keep in (("capture", np.arange(len(captures)) != index),
                             ("family", np.array(residuals.groups) != residuals.groups[index])):
            held_out = RangeBasis(basis.profile, _evidence_without(residuals, keep), basis.clocks, True, None)
            ranges = {f: level_range(predicted[f], f, held_out) for f in FIGURES}
            row[f"range_without_{scheme}"] = ranges
            for f in FIGURES:
                low, high = ranges[f]
                hits[(scheme, f)].append(bool(low <= actual[f] <= high))
                assert low < predicted[f] < high, f"{name}: {f} range {ranges[f]} not two-sided"
        rows.append(row)
    return {"captures": rows, "families": sorted(set(residuals.groups)),
            "coverage": {f"leave_one_{scheme}_out": {f: coverage(hits[(scheme, f)]) for f in FIGURES}
                         for scheme in ("capture", "family")},
            "shipped_range_energy": {r["trace"]: level_range(r["predicted"]["energy_j"], "energy_j", basis)
                                     for r in rows}}


def _body_coverage(residuals: Residuals, by_group: bool) -> dict[str, Any]:
    """Leave-one-out coverage of each figure's residuals, and (``by_group``) leave-one-group-out."""
    report = {"leave_one_out": {f: coverage(held_out_hits(residuals.values[f], residuals.labels)) for f in FIGURES}}
    if by_group:
        report["leave_one_gpu_out"] = {f: coverage(held_out_hits(residuals.values[f], residuals.groups))
                                       for f in FIGURES}
    return report


def evidence_coverage() -> dict[str, Any]:
    """Held-out coverage of each body of evidence from the public sweeps and Table 1."""
    return {"clocks_fitted": _body_coverage(sweep_clock_residuals(transfer=False), by_group=True),
            "clocks_transfer": _body_coverage(sweep_clock_residuals(transfer=True), by_group=True),
            "level_transfer": _body_coverage(transfer_level_residuals(), by_group=True),
            "clocks_rtx3080ti": _body_coverage(table1_residuals(load_profile("rtx3080ti")), by_group=False)}


def shipped_reproduced() -> dict[str, Any]:
    """Whether the shipped file's H200 level residuals are those computed from the data now (to 1e-5)."""
    profile, document = load_profile("h200"), json.loads(MODEL_ERROR_PATH.read_text())
    fresh = capture_residuals(profile, real_captures(profile))
    shipped = document["level"][profile.name]["figures"]
    same = all(np.allclose(shipped[f], fresh.values[f], atol=2e-5) for f in FIGURES)
    return {"date_utc": document["date_utc"], "git_revision": document["git_revision"],
            "level_h200_reproduced": bool(same)}


def examples() -> dict[str, Any]:
    """The ranges the product gives the GPT-3 XL step on the H200 and on the B200: auto joules per step and the
    static and latency-optimal plans at a 1% budget (16 sampled profiles)."""
    report = {}
    spec = UncertaintySpec()
    for gpu in ("h200", "b200"):
        profile, trace = load_profile(gpu), open_trace(EXAMPLE_TRACE)
        auto = predictions(with_measured_gaps(trace), profile, [])
        with_ranges(auto, with_measured_gaps(trace), profile, [], spec)
        problem = Problem.build(trace, profile, 0.01)
        rows = compare(problem, [0.01], EXAMPLE_METHODS)
        ranges = row_ranges(problem, rows, spec)
        report[gpu] = {"auto_energy_j": auto[0]["energy_j"], "auto_energy_range_j": auto[0]["range"]["energy_j"],
                       "note": range_basis(profile).note,
                       "methods": {row.executed.method: {"energy_saved_pct": row.executed.energy_saved_pct,
                                                         "slowdown_pct": row.executed.slowdown_pct,
                                                         "range": None if r is None else r.as_json()}
                                   for row, r in zip(rows, ranges, strict=True)}}
    return report


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"


def _coverage_cell(c: dict[str, Any]) -> str:
    low, high = c["interval_95"]
    return f"{c['covered']}/{c['n']} = {_pct(c['share'])} [{_pct(low)}, {_pct(high)}]"


def _capture_lines(report: dict[str, Any]) -> list[str]:
    energy = report["coverage"]["leave_one_capture_out"]["energy_j"]
    met = TARGET[0] <= energy["share"] <= TARGET[1]
    lines = ["", f"## Real H200 captures ({len(report['captures'])}, families: {', '.join(report['families'])})", "",
             f"Target: {_pct(TARGET[0])}-{_pct(TARGET[1])} of the measured joules per step inside their "
             f"{COVERAGE:.0%} range, each range built without its own capture's residual: "
             f"**{'met' if met else 'missed'}** ({_coverage_cell(energy)}; 95% interval on the coverage in brackets). "
             "Every range two-sided (checked).", "",
             "| held out | figure | inside the range |", "| --- | --- | ---: |"]
    for scheme, figures in report["coverage"].items():
        for figure, c in figures.items():
            lines.append(f"| {scheme.replace('_', ' ')} | {figure} | {_coverage_cell(c)} |")
    lines += ["", "| capture | family | measured J | predicted J | range without it (J) | range without its family |",
              "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in report["captures"]:
        own, family = r["range_without_capture"]["energy_j"], r["range_without_family"]["energy_j"]
        lines.append(f"| {r['trace']} | {r['family']} | {r['measured']['energy_j']:.2f} | "
                     f"{r['predicted']['energy_j']:.2f} | [{own[0]:.2f}, {own[1]:.2f}] | "
                     f"[{family[0]:.2f}, {family[1]:.2f}] |")
    return lines


def _evidence_lines(report: dict[str, Any]) -> list[str]:
    lines = ["", "## Public sweeps and Table 1: each residual against the range of the others", "",
             "| evidence | held out | time | energy | power |", "| --- | --- | ---: | ---: | ---: |"]
    for body, schemes in report.items():
        for scheme, figures in schemes.items():
            lines.append(f"| {body} | {scheme.replace('_', ' ')} | "
                         + " | ".join(_coverage_cell(figures[f]) for f in FIGURES) + " |")
    return lines


def _range_text(value: float, bounds: Sequence[float]) -> str:
    return f"{value:.2f} [{bounds[0]:.2f}, {bounds[1]:.2f}]"


def _example_lines(report: dict[str, Any]) -> list[str]:
    lines = ["", f"## Ranges as shipped: {EXAMPLE_TRACE}, 1% budget, 16 sampled profiles", "",
             "| GPU | auto J per step | static saved % | static slowdown % | latency-optimal saved % | "
             "latency-optimal slowdown % |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for gpu, r in report.items():
        cells = [_range_text(r["auto_energy_j"], r["auto_energy_range_j"])]
        for method in EXAMPLE_METHODS:
            m = r["methods"][method]
            cells += [_range_text(m["energy_saved_pct"], m["range"]["energy_saved_pct"]),
                      _range_text(m["slowdown_pct"], m["range"]["slowdown_pct"])]
        lines.append(f"| {gpu} | " + " | ".join(cells) + " |")
    notes = [f"{gpu}: {r['note']}" for gpu, r in report.items() if r["note"]]
    return lines + ([""] + [f"Note shown with every {n}" for n in notes] if notes else [])


def _markdown(result: dict[str, Any]) -> str:
    shipped = result["shipped"]
    lines = ["# Coverage of the 90% ranges", "", *provenance_lines(result["provenance"]), "",
             f"Ranges rest on `configs/model_error.json` (derived {shipped['date_utc']} at "
             f"`{shipped['git_revision'][:7]}`, H200 level residuals reproduced from the data now: "
             f"{'yes' if shipped['level_h200_reproduced'] else 'NO'}). How they are built: "
             "`docs/design/cost-model.md` (Uncertainty)."]
    lines += _capture_lines(result["captures"])
    lines += _evidence_lines(result["evidence"])
    lines += _example_lines(result["examples"])
    return "\n".join(lines) + "\n"


def main() -> None:
    result = {"provenance": provenance("python -m benchmarks.model.uncertainty_coverage"), "target": list(TARGET),
              "coverage": COVERAGE, "shipped": shipped_reproduced(), "captures": capture_coverage(),
              "evidence": evidence_coverage(), "examples": examples()}
    write_results("uncertainty_coverage", result, _markdown(result))
    print(_markdown(result))


if __name__ == "__main__":
    main()
