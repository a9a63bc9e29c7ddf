"""The ``report`` stage of ``benchmarks/h200/workloads.py``: predicted vs measured joules per step at auto on the
captured H200 workloads and the bundled H200 steps (``benchmarks/results/workloads_h200.{json,md}``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.provenance import provenance, provenance_lines, write_results
from kdvfs.common.paths import DATA_DIR
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile
from kdvfs.envs.model.cost_tables import build_tables
from kdvfs.envs.model.estimate import estimate_features
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.trace import Category, Trace

TARGET = 0.05
CAPTURES = DATA_DIR / "traces" / "h200" / "workloads"
BUNDLED = {"gpt3xl-b4 (bundled)": "h200/gpt3xl-24layer-b4", "gpt2s-b16 (bundled)": "h200/gpt2s-b16",
           "resnet50-b128 (bundled)": "h200/resnet50-b128"}
PARTS = ("tensor_gemm", "simt_gemm", "other_kernels", "gaps")


def _part_of(trace: Trace, profile: GpuProfile) -> np.ndarray:
    """Each kernel's part: kernels on the tensor cores (GEMMs, attention), GEMMs off them, every other kernel."""
    estimated = estimate_features(trace, profile) if not trace.has_features.all() else trace
    return np.array(["tensor_gemm" if (k.features and (k.features.tensor_util or 0.0) > 0.0) else
                     "simt_gemm" if k.category is Category.GEMM else "other_kernels" for k in estimated.kernels])


def predict(trace: Trace, profile: GpuProfile) -> dict[str, Any]:
    """Predicted joules per step at auto (default memory clock) with its split, against the measurement."""
    tables = build_tables(trace, profile)
    energy_j, time_s = tables.auto_energy_j[:, 0], tables.auto_time_s[:, 0]
    gap_j = float((tables.gap_s * tables.auto_gap_power_w[:, 0]).sum())
    parts = _part_of(trace, profile)
    split = {part: float(energy_j[parts == part].sum()) for part in PARTS[:3]} | {"gaps": gap_j}
    measured = trace.meta.measurements
    predicted_j = float(energy_j.sum()) + gap_j
    gap_s = float(tables.gap_s.sum())
    gaps = tables.gap_s[tables.gap_s > 0]
    return {
        "measured_j": measured["energy_j_per_step"], "predicted_j": predicted_j,
        "error": predicted_j / measured["energy_j_per_step"] - 1.0,
        "measured_avg_power_w": measured.get("avg_power_w"), "predicted_avg_power_w": predicted_j /
        (float(time_s.sum()) + gap_s), "step_s": measured["step_time_s"],
        "profiled_step_s": measured.get("profiled_step_time_s"), "kernels": len(trace), "split_j": split,
        "gap_s": gap_s, "median_gap_s": float(np.median(gaps)) if len(gaps) else 0.0,
        "model_gap_power_w": gap_j / gap_s if gap_s else None,
        "implied_gap_power_w": (measured["energy_j_per_step"] - predicted_j + gap_j) / gap_s if gap_s else None,
    }


def _captures(folder: Path) -> dict[str, Trace]:
    paths = sorted(folder.glob("*.trace.json.gz")) + sorted(folder.glob("*.trace.json"))
    return {p.name.split(".trace.json")[0]: load_trace(p) for p in paths if not p.name.startswith("ncu-")}


def report(folder: Path | None = None) -> str:
    """Predict every capture of ``folder`` (default: the committed ones) and the bundled steps; write the results
    files and return the Markdown."""
    folder = folder or CAPTURES
    profile = load_profile("h200")
    rows = {label: predict(trace, profile) for label, trace in _captures(folder).items()}
    rows |= {label: predict(open_trace(name), profile) for label, name in BUNDLED.items()}
    within = sum(abs(r["error"]) <= TARGET for r in rows.values())
    where = folder.relative_to(DATA_DIR.parent) if folder.is_relative_to(DATA_DIR.parent) else folder
    command = f"python -m benchmarks.h200.workloads report {where}"
    result = {**provenance(command), "target": TARGET, "within_target": within, "workloads": rows,
              "pooled_gap_power_w": _pooled_gap_power_w(rows)}
    markdown = _markdown(result)
    write_results("workloads_h200", result, markdown, indent=1)
    return markdown


def _pooled_gap_power_w(rows: dict[str, Any]) -> float:
    """The one gap power (W) that best explains the captured steps' residuals (least squares over their gaps)."""
    captured = [r for label, r in rows.items() if "bundled" not in label and r["gap_s"] > 0]
    kernels_j = np.array([r["predicted_j"] - r["split_j"]["gaps"] for r in captured])
    gap_s = np.array([r["gap_s"] for r in captured])
    measured = np.array([r["measured_j"] for r in captured])
    weight = 1.0 / measured
    return float(((measured - kernels_j) * gap_s * weight**2).sum() / ((gap_s * weight) ** 2).sum())


def _markdown(result: dict[str, Any]) -> str:
    rows = result["workloads"]
    lines = ["# H200 workloads: joules per step at auto, predicted vs measured", "", *provenance_lines(result), "",
             f"Shipped `h200` profile, auto clocks at the default memory clock (`kdvfs predict`'s first line) against "
             f"NVML joules per step over the unprofiled window. Target: within {TARGET:.0%}; "
             f"{result['within_target']} of {len(rows)} are. Nothing was fitted on these measurements.", "",
             "| workload | kernels | step ms (profiled) | measured J | predicted J | error | avg W measured / "
             "predicted | tensor-core kernels J | SIMT GEMM J | other kernels J | gaps J (ms) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, r in rows.items():
        split, profiled = r["split_j"], r["profiled_step_s"]
        measured_w = r["measured_avg_power_w"] or r["measured_j"] / r["step_s"]
        lines.append(f"| {label} | {r['kernels']} | {r['step_s'] * 1e3:.1f}"
                     f"{f' ({profiled * 1e3:.1f})' if profiled else ''} | {r['measured_j']:.2f} | "
                     f"{r['predicted_j']:.2f} | {r['error']:+.1%} | {measured_w:.0f} / "
                     f"{r['predicted_avg_power_w']:.0f} | {split['tensor_gemm']:.2f} | {split['simt_gemm']:.2f} | "
                     f"{split['other_kernels']:.2f} | "
                     f"{split['gaps']:.2f} ({r['gap_s'] * 1e3:.1f}) |")
    lines += ["", "## Idle gaps", "",
              "Gaps are those of the unprofiled step: the profiled gaps shrunk in proportion so the step lasts the "
              "measured step time (kernels keep their traced durations). The gap power a step implies is what its "
              "measured energy leaves after the predicted kernel energy, over its gap time (it carries the kernels' "
              "error too, so it is meaningful where gaps are a large share of the step).", "",
              "| workload | gap share of step | median gap us | model gap W | implied gap W |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for label, r in rows.items():
        if "bundled" in label or not r["gap_s"]:
            continue
        lines.append(f"| {label} | {r['gap_s'] / r['step_s']:.0%} | {r['median_gap_s'] * 1e6:.1f} | "
                     f"{r['model_gap_power_w']:.0f} | {r['implied_gap_power_w']:.0f} |")
    lines += ["", f"One gap power fitted to every capture's residual (least squares): "
              f"{result['pooled_gap_power_w']:.0f} W.", ""]
    misses = [f"- {label}: {r['error']:+.1%}" for label, r in rows.items() if abs(r["error"]) > TARGET]
    return "\n".join([*lines, "## Outside the target", "", *(misses or ["- none"])]) + "\n"
