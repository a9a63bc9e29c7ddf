"""Compare synthetic transformer traces with the real H200 traces they model.

Usage: ``python -m benchmarks.model.synthetic_vs_real``. For each workload preset and its measured bundled trace it
reports kernels per step, kernels per layer (the period of the repeating forward + backward kernel pattern,
see ``kdvfs.envs.synthetic.generator.layer_kernel_counts``), step time (kernels + gaps) and the share of kernel time per
category, with relative errors ``(generated - real) / real``; where the generated activities line up one to
one with the real ones (same kinds and categories in the same order), also the kernel time per efficiency
class. Writes ``benchmarks/results/synthetic_vs_real.json`` and ``.md``.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Any

from benchmarks.common.provenance import provenance, provenance_lines, write_results
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.synthetic.generator import (
    generate_transformer_trace,
    layer_kernel_counts,
    load_workload,
)
from kdvfs.envs.synthetic.kernels import step_specs
from kdvfs.envs.synthetic.workload import TransformerConfig
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.trace import Kind, Trace

CASES = (("gpt3xl", "h200/gpt3xl-24layer-b4"), ("gpt2s", "h200/gpt2s-b16"))
TOLERANCE = 0.25
COMMAND = "python -m benchmarks.model.synthetic_vs_real"


def summarize(trace: Trace, layers: int) -> dict[str, Any]:
    """Counts, step time and per-category kernel-time shares of one step."""
    per_layer, non_layer = layer_kernel_counts(trace, layers)
    by_category: dict[str, float] = defaultdict(float)
    for k in trace.kernels:
        by_category[k.category.value] += k.duration_s
    return {"kernels": trace.count(Kind.KERNEL), "memsets": trace.count(Kind.MEMSET),
            "kernels_per_layer": per_layer, "non_layer_kernels": non_layer, "step_time_s": trace.step_time_s,
            "busy_s": trace.busy_s,
            "category_share": {c: t / trace.busy_s for c, t in sorted(by_category.items(), key=lambda kv: -kv[1])}}


def class_times(config: TransformerConfig, generated: Trace, real: Trace) -> dict[str, dict[str, float]] | None:
    """Kernel time (s) per efficiency class, generated and real, when the two sequences align one to one."""
    if len(generated) != len(real) or any(g.kind is not r.kind or g.category is not r.category
                                          for g, r in zip(generated.kernels, real.kernels, strict=True)):
        return None
    times: dict[str, dict[str, float]] = {}
    for spec, g, r in zip(step_specs(config), generated.kernels, real.kernels, strict=True):
        entry = times.setdefault(spec.eff.value, {"generated_s": 0.0, "real_s": 0.0, "activities": 0})
        entry["generated_s"] += g.duration_s
        entry["real_s"] += r.duration_s
        entry["activities"] += 1
    return dict(sorted(times.items(), key=lambda kv: -kv[1]["real_s"]))


def compare(workload: str, real_name: str) -> dict[str, Any]:
    """Generated vs real figures of one workload, with relative errors and the 25 % verdicts."""
    config = load_workload(workload)
    generated_trace, real_trace = generate_transformer_trace(config, load_profile("h200")), open_trace(real_name)
    generated, real = summarize(generated_trace, config.layers), summarize(real_trace, config.layers)
    measured = real_trace.meta.measurements.get("step_time_s")
    errors = {key: (generated[key] - real[key]) / real[key]
              for key in ("kernels", "kernels_per_layer", "step_time_s")}
    if measured:
        errors["step_time_vs_measured_s"] = (generated["step_time_s"] - measured) / measured
    return {"workload": workload, "config": config.summary(), "real_trace": real_name,
            "real_measured_step_time_s": measured, "generated": generated, "real": real,
            "relative_error": errors, "efficiency_class_time": class_times(config, generated_trace, real_trace),
            "within_25pct": {key: abs(errors[key]) <= TOLERANCE for key in ("kernels_per_layer", "step_time_s")}}


def markdown(document: dict[str, Any]) -> str:
    """The results as a Markdown report."""
    lines = ["# Synthetic vs real transformer traces (H200)", "",
             *provenance_lines(document),
             "", "Relative error = (generated - real) / real. Kernels per layer = period of the repeating forward "
             "plus backward kernel pattern (memsets excluded); non-layer kernels = the rest.", ""]
    for case in document["cases"]:
        gen, real, err = case["generated"], case["real"], case["relative_error"]
        lines += [f"## {case['workload']} vs `{case['real_trace']}`", "", f"Config: `{case['config']}`", "",
                  "| metric | generated | real | relative error |", "| --- | ---: | ---: | ---: |"]
        for key, unit, scale in (("kernels", "", 1), ("kernels_per_layer", "", 1), ("non_layer_kernels", "", 1),
                                 ("memsets", "", 1), ("step_time_s", " ms", 1e3)):
            error = f"{err[key]:+.1%}" if key in err else ""
            lines.append(f"| {key} | {gen[key] * scale:.4g}{unit} | {real[key] * scale:.4g}{unit} | {error} |")
        measured = case["real_measured_step_time_s"]
        if measured:
            lines.append(f"| step time vs NVML-measured | {gen['step_time_s'] * 1e3:.4g} ms | {measured * 1e3:.4g} ms "
                         f"| {err['step_time_vs_measured_s']:+.1%} |")
        verdict = ", ".join(f"{k}: {'pass' if ok else 'MISS'}" for k, ok in case["within_25pct"].items())
        lines += ["", f"Within 25 %: {verdict}", "", "| category | generated share | real share |",
                  "| --- | ---: | ---: |"]
        for category in sorted(set(gen["category_share"]) | set(real["category_share"]),
                               key=lambda c: -real["category_share"].get(c, 0.0)):
            lines.append(f"| {category} | {gen['category_share'].get(category, 0.0):.1%} | "
                         f"{real['category_share'].get(category, 0.0):.1%} |")
        lines += ["", *class_table(case["efficiency_class_time"]), ""]
    return "\n".join(lines)


def class_table(times: dict[str, dict[str, float]] | None) -> list[str]:
    """Markdown rows of the per-efficiency-class comparison, or a note why there is none."""
    if times is None:
        return ["Per efficiency class: not shown, the generated and real activity sequences do not line up one "
                "to one."]
    rows = ["| efficiency class | activities | generated | real | relative error |",
            "| --- | ---: | ---: | ---: | ---: |"]
    for name, t in times.items():
        error = (t["generated_s"] - t["real_s"]) / t["real_s"]
        rows.append(f"| {name} | {t['activities']:.0f} | {t['generated_s'] * 1e3:.3f} ms | "
                    f"{t['real_s'] * 1e3:.3f} ms | {error:+.1%} |")
    return rows


def main() -> int:
    document = {**provenance(COMMAND), "tolerance": TOLERANCE, "cases": [compare(w, r) for w, r in CASES]}
    report = markdown(document)
    write_results("synthetic_vs_real", document, report, indent=1)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
