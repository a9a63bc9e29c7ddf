"""Validate ``kdvfs.envs.model.estimate.estimate_features`` against Nsight Compute counters of the bundled H200 traces.

Usage: ``python -m benchmarks.model.estimate_vs_ncu``. Two comparisons:

- ``resnet50-b128``: the first 400 kernels carry ncu counters; all features are stripped and re-estimated.
- ``gpt3xl-24layer-b4`` (op shapes, no counters) against the ncu counters of ``gpt3xl-1layer-b4`` (counters,
  no op shapes): a 24-layer kernel takes the counters of the 1-layer kernel with the same name and grid whose
  duration is nearest to its own, when within ``DURATION_TOLERANCE``; the layers have equal shapes.

Each runs twice: with the module's priors (derived from both traces: in-sample for prior-estimated kernels
and for the SM-per-DRAM proxy) and with priors derived from the other trace only (leave-one-workload-out).
Writes ``benchmarks/results/estimate_vs_ncu.{json,md}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from benchmarks.common.provenance import provenance, provenance_lines, write_results
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile
from kdvfs.envs.model.estimate import FEATURE_PRIORS, CategoryPrior, derive_priors, estimate_features, split_work
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.trace import Category, Features, Kind, Trace

DURATION_TOLERANCE = 0.25
COMMAND = "python -m benchmarks.model.estimate_vs_ncu"


@dataclass(frozen=True)
class Comparison:
    """Kernels with reference counters: their estimated and measured features and how they were estimated."""

    workload: str
    categories: list[Category]
    durations_s: np.ndarray
    estimated: np.ndarray  # (n, 3): sm_util, dram_util, tensor_util
    measured: np.ndarray  # (n, 3)
    from_prior: np.ndarray  # (n,) bool
    raw_tensor_sm: np.ndarray  # unclipped FLOP/s over peak of the tensor-core kernels


def strip(trace: Trace) -> Trace:
    """The trace with every kernel's features removed."""
    return replace(trace, kernels=tuple(replace(k, features=None) for k in trace.kernels))


def match_by_name_grid(trace: Trace, reference: Trace) -> dict[int, Features]:
    """Counters of ``reference`` for kernels of ``trace``: same name and grid, nearest duration within tolerance."""
    candidates: dict[tuple[str, tuple[int, int, int]], list[tuple[float, Features]]] = {}
    for k in reference.kernels:
        if k.features is not None:
            candidates.setdefault((k.name, k.grid), []).append((k.duration_s, k.features))
    matched = {}
    for index, kernel in enumerate(trace.kernels):
        options = candidates.get((kernel.name, kernel.grid), [])
        if kernel.kind is Kind.KERNEL and options:
            duration_s, features = min(options, key=lambda o: abs(o[0] - kernel.duration_s))
            if abs(kernel.duration_s / duration_s - 1.0) <= DURATION_TOLERANCE:
                matched[index] = features
    return matched


def _triple(f: Features) -> tuple[float, float, float]:
    return f.sm_util, f.dram_util, f.tensor_util or 0.0


def compare(workload: str, trace: Trace, reference: Mapping[int, Features], profile: GpuProfile,
            priors: Mapping[Category, CategoryPrior]) -> Comparison:
    """Estimate the (feature-less) trace and line the estimates up with the reference counters."""
    estimated = estimate_features(trace, profile, priors)
    work = split_work(trace)
    indices = sorted(reference)
    kernels = [estimated.kernels[i] for i in indices]
    raw = [w.flops / k.duration_s / profile.roofline.peak_flops[w.precision]
           for k, w in zip(estimated.kernels, work, strict=True) if w is not None and w.tensor_cores]
    return Comparison(
        workload=workload, categories=[k.category for k in kernels],
        durations_s=np.array([k.duration_s for k in kernels]),
        estimated=np.array([_triple(k.features) for k in kernels if k.features is not None]),
        measured=np.array([_triple(reference[i]) for i in indices]),
        from_prior=np.array([work[i] is None for i in indices]), raw_tensor_sm=np.array(raw))


def _errors(c: Comparison, mask: np.ndarray) -> dict[str, float]:
    """Median and duration-weighted mean absolute errors, and duration-weighted bias, of the masked kernels."""
    error = c.estimated[mask] - c.measured[mask]
    weights = c.durations_s[mask] / c.durations_s[mask].sum()
    out: dict[str, float] = {"n": int(mask.sum()), "n_prior": int(c.from_prior[mask].sum()),
                             "time_ms": round(float(c.durations_s[mask].sum() * 1e3), 3)}
    for column, label in enumerate(("sm_util", "dram_util", "tensor_util")):
        out[f"{label}_median_abs_err"] = round(float(np.median(np.abs(error[:, column]))), 4)
        out[f"{label}_time_weighted_abs_err"] = round(float(weights @ np.abs(error[:, column])), 4)
        out[f"{label}_time_weighted_bias"] = round(float(weights @ error[:, column]), 4)
    return out


def summarise(c: Comparison) -> dict[str, object]:
    """Per-category and overall errors, plus the gross-bug check on unclipped tensor-core utilisation."""
    categories = np.array([cat.value for cat in c.categories])
    per_category = {cat: _errors(c, categories == cat) for cat in sorted(set(categories))}
    return {"overall": _errors(c, np.ones(len(categories), dtype=bool)), "per_category": per_category,
            "estimated_from_ops": _errors(c, ~c.from_prior) if (~c.from_prior).any() else {},
            "tensor_kernels_unclipped_sm_util": {
                "n": int(c.raw_tensor_sm.size), "max": round(float(c.raw_tensor_sm.max()), 3),
                "n_above_1": int((c.raw_tensor_sm > 1.0).sum()),
                "median": round(float(np.median(c.raw_tensor_sm)), 3)}}


def run(profile: GpuProfile) -> dict[str, object]:
    """Both comparisons with in-sample and leave-one-workload-out priors."""
    resnet, gpt_1layer = open_trace("h200/resnet50-b128"), open_trace("h200/gpt3xl-1layer-b4")
    gpt_24layer = open_trace("h200/gpt3xl-24layer-b4")
    resnet_reference = {i: k.features for i, k in enumerate(resnet.kernels) if k.features is not None}
    cases = {
        "resnet50-b128": (strip(resnet), resnet_reference, derive_priors([gpt_1layer])),
        "gpt3xl-24layer-b4 vs gpt3xl-1layer-b4 ncu": (
            gpt_24layer, match_by_name_grid(gpt_24layer, gpt_1layer), derive_priors([resnet])),
    }
    results: dict[str, object] = {}
    for label, (trace, reference, other_priors) in cases.items():
        results[label] = {
            "kernels_in_trace": trace.count(Kind.KERNEL), "kernels_with_reference": len(reference),
            "reference_share_of_trace_time": round(sum(trace.kernels[i].duration_s for i in reference)
                                                   / trace.busy_s, 3),
            "module_priors": summarise(compare(label, trace, reference, profile, FEATURE_PRIORS)),
            "leave_one_workload_out_priors": summarise(compare(label, trace, reference, profile, other_priors)),
        }
    return results


def markdown(document: Mapping[str, object]) -> str:
    """The headline figures as a Markdown report."""
    lines = ["# estimate_features vs Nsight Compute (H200)", ""]
    lines += provenance_lines(document)
    lines += ["", "Errors are estimate minus ncu, in utilisation fractions: `med abs` the median absolute error over "
              "kernels, `tw abs` / `tw bias` the duration-weighted mean absolute / signed error. `n (prior)`: "
              "kernels compared (of which estimated from category priors). Module priors are in-sample (derived "
              "from both ncu traces); leave-one-workload-out priors come from the other trace only. Analysis: "
              "docs/design/feature-estimation.md."]
    results = document["results"]
    assert isinstance(results, dict)
    for label, result in results.items():
        lines += ["", f"## {label}", "", f"{result['kernels_with_reference']} of {result['kernels_in_trace']} "
                  f"kernels with counters ({result['reference_share_of_trace_time']:.0%} of the trace's kernel "
                  "time).", ""]
        for priors in ("module_priors", "leave_one_workload_out_priors"):
            summary = result[priors]
            check = summary["tensor_kernels_unclipped_sm_util"]
            lines += [f"### {priors.replace('_', ' ')}", "",
                      f"Tensor-core kernels: unclipped sm_util median {check['median']}, max {check['max']}, "
                      f"{check['n_above_1']} of {check['n']} above 1.", "",
                      "| category | n (prior) | time ms | sm med abs | sm tw abs | sm tw bias | dram med abs "
                      "| dram tw abs | dram tw bias |", "|---|---|---|---|---|---|---|---|---|"]
            rows = {**summary["per_category"], "**all**": summary["overall"], "**from ops**":
                    summary["estimated_from_ops"]}
            for name, e in rows.items():
                lines.append(f"| {name} | {e['n']} ({e['n_prior']}) | {e['time_ms']} | {e['sm_util_median_abs_err']} "
                             f"| {e['sm_util_time_weighted_abs_err']} | {e['sm_util_time_weighted_bias']} "
                             f"| {e['dram_util_median_abs_err']} | {e['dram_util_time_weighted_abs_err']} "
                             f"| {e['dram_util_time_weighted_bias']} |")
            lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    document = {**provenance(COMMAND), "profile": "h200", "duration_tolerance": DURATION_TOLERANCE,
                "results": run(load_profile("h200"))}
    report = markdown(document)
    write_results("estimate_vs_ncu", document, report, indent=1)
    print(report)


if __name__ == "__main__":
    main()
