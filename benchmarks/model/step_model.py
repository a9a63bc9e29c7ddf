"""Step model, leave-one-shape-out on H200 captures of three families: kernel time, step time, duration errors.

Each captured shape of a family (``data/traces/h200/workloads``: llama, a dense decoder; mixtral, an MoE;
bert, an encoder) is predicted by the step model fitted on the family's other shapes (on the basis they
determine: ``basis_terms``) and compared with its capture. Also the time to fit a family and to predict one step.

    python -m benchmarks.model.step_model
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.provenance import provenance, provenance_lines, write_results
from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.model.step.validation import leave_one_out
from kdvfs.envs.model.step_model import StepModel
from kdvfs.envs.trace.format import load_trace

WORKLOADS = REPO_ROOT / "data" / "traces" / "h200" / "workloads"
FAMILIES = ("llama", "mixtral", "bert")


def family_traces(family: str, folder: Path = WORKLOADS) -> list[Any]:
    """The captured steps of one family, by file name."""
    return [load_trace(path) for path in sorted(folder.glob(f"{family}-*.trace.json.gz"))]


def _summary(rows: list[dict[str, Any]]) -> dict[str, float | int]:
    out: dict[str, float | int] = {"shapes": len(rows)}
    for key in ("kernel_time_error_pct", "step_time_error_pct", "weighted_duration_error_pct"):
        out[f"max_abs_{key}"] = float(max((abs(r[key]) for r in rows), default=float("nan")))
    return out


def _family(family: str) -> dict[str, Any]:
    traces = family_traces(family)
    start = time.perf_counter()
    model = StepModel.fit(traces)
    fit_s = time.perf_counter() - start
    shape = traces[0].meta.step_shape
    probe = type(shape).of([(dims[0], dims[1] + 64) if len(dims) == 2 else dims for dims in shape.inputs])
    start = time.perf_counter()
    predicted = model.predict(probe)
    predict_s = time.perf_counter() - start
    rows = [e.as_json() for e in leave_one_out(traces)]
    return {"family": family, "kernels": int(np.mean([len(t) for t in traces])), "fit_s": fit_s,
            "predict_s": predict_s, "predicted_kernels": len(predicted), "shapes": rows,
            "interior": _summary([r for r in rows if not r["edge"]]), "edge": _summary([r for r in rows if r["edge"]])}


def _markdown(result: dict[str, Any]) -> str:
    lines = ["# Step model: leave-one-shape-out (H200 captures)", "", *provenance_lines(result["provenance"]), "",
             "| family | shape | edge | basis (others) | kernel time error | step time error "
             "| weighted duration error |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for family in result["families"]:
        for row in family["shapes"]:
            lines.append(f"| {family['family']} | {row['shape']} | {'yes' if row['edge'] else 'no'} | "
                         f"{row['basis_terms']} | "
                         f"{row['kernel_time_error_pct']:+.2f}% | {row['step_time_error_pct']:+.2f}% | "
                         f"{row['weighted_duration_error_pct']:.2f}% |")
    lines += ["", "| family | fit (s) | predict (ms) | kernels |", "| --- | --- | --- | --- |"]
    lines += [f"| {f['family']} | {f['fit_s']:.2f} | {1e3 * f['predict_s']:.1f} | {f['kernels']} |"
              for f in result["families"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    StepModel.fit(family_traces("bert")[:2])  # compile the alignment before timing
    result = {"provenance": provenance("python -m benchmarks.model.step_model"),
              "families": [_family(family) for family in FAMILIES]}
    write_results("step_model", result, _markdown(result))


if __name__ == "__main__":
    main()
