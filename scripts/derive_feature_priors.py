"""Derive the per-category feature priors of ``kdvfs.envs.model.estimate.FEATURE_PRIORS`` from real ncu counters.

Usage: ``python scripts/derive_feature_priors.py``. Reads the ncu-enriched bundled traces, prints the table (and the
Python literal to paste into ``envs/model/estimate.py``) and writes ``benchmarks/results/feature_priors.json`` with the
run's command, machine, Python, date and revision.
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import asdict
from datetime import UTC, datetime

from kdvfs.common.paths import REPO_ROOT
from kdvfs.common.run_record import git_revision
from kdvfs.envs.model.estimate import CategoryPrior, derive_priors
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.trace import Category, Trace

TRACES = ("h200/gpt3xl-1layer-b4", "h200/resnet50-b128")
OUTPUT = REPO_ROOT / "benchmarks" / "results" / "feature_priors.json"
FIGURE = ("the per-category feature priors of kdvfs.envs.model.estimate.FEATURE_PRIORS, derived from the ncu counters "
          "of the bundled H200 traces (claim list: docs/results.md)")


def measured_counts(traces: list[Trace]) -> dict[Category, int]:
    """Number of ncu-measured kernels per category."""
    counts = dict.fromkeys(Category, 0)
    for trace in traces:
        for k in trace.kernels:
            if k.features is not None and k.features.source.startswith("ncu:"):
                counts[k.category] += 1
    return counts


def as_literal(priors: dict[Category, CategoryPrior]) -> str:
    """The priors as the Python mapping literal of ``envs/model/estimate.py``."""
    lines = [f"    Category.{c.name}: CategoryPrior({p.sm_util}, {p.dram_util}, {p.tensor_util}, {p.sm_per_dram}),"
             for c, p in priors.items()]
    return "FEATURE_PRIORS: Mapping[Category, CategoryPrior] = {\n" + "\n".join(lines) + "\n}"


def main() -> None:
    traces = [open_trace(name) for name in TRACES]
    priors = derive_priors(traces)
    counts = measured_counts(traces)
    print(f"{'category':14s} {'n':>4s} {'sm_util':>8s} {'dram_util':>9s} {'tensor_util':>11s} {'sm_per_dram':>11s}")
    for category, prior in priors.items():
        print(f"{category.value:14s} {counts[category]:4d} {prior.sm_util:8.3f} {prior.dram_util:9.3f} "
              f"{prior.tensor_util:11.3f} {prior.sm_per_dram:11.3f}")
    print()
    print(as_literal(priors))
    document = {"figure": FIGURE, "command": "python scripts/derive_feature_priors.py", "machine": platform.node(),
                "python": sys.version.split()[0], "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
                "git_revision": git_revision(), "traces": list(TRACES),
                "statistic": "duration-weighted median over ncu-measured kernels; sm_per_dram over kernels "
                             "without tensor-core use and with dram_util >= 0.05",
                "priors": {c.value: {**asdict(p), "n_kernels": counts[c]} for c, p in priors.items()}}
    OUTPUT.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
