"""What a margin chosen from what a controller knows ahead of a step could save over the bar, on validation pairs.

    python -m benchmarks.learned.margin_information [--gpus h200 b200 a100-sxm4] [--name margin_information]

How much room a residual policy has over the bar it must clear (issue 52), read off fixed-margin plans alone. Per
GPU, every fixed-margin fitting plan (:mod:`kdvfs.agents.learned.training.margin_plans`, margins 0-100% of the
budget and the release) runs every validation case (pair x budget x latency cell x noise seed, every disturbance
on). Leave one family out: on the other families' episodes, per cell, the **bar** is the margin saving the most
among those within budget in >= 95% of them; a **margin by what is known** is the same choice made apart in each
tercile of a quantity a controller could know before the step runs (terciles over those families' episodes);
both are scored on the family left out, and over the families each episode is scored once. The quantities:
``scale``, auto's step time over the prediction's as the runtime reads it from its auto windows (the step's own
error times auto's drift; what observation v10 carries), and its two parts apart (``error``, the executed step's
auto time over the predicted one; ``drift``, auto's modelled drift at the episode's start), which a controller
never sees apart. The **per-episode bound** is each episode's best margin within budget (hindsight: no margin
chosen ahead does better). Validation pairs only: nothing held out is read. Writes
``benchmarks/results/<name>.{json,md}``.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks.common.provenance import provenance, provenance_lines, write_results
from kdvfs.agents.learned.training.margin_plans import (
    CELL_BUDGETS,
    CELL_LATENCY_SCALES,
    COMPLIANCE,
    episodes,
    margin_actors,
    most_saving_compliant,
    score_seeds,
    within,
)
from kdvfs.agents.learned.training.ppo import build_pairs, load_train_config
from kdvfs.envs.gpu.profiles import load_profile

GPUS = ("h200", "b200", "a100-sxm4")
KNOWN = (("scale",), ("error",), ("drift",), ("error", "drift"))
"""The quantities (or pairs of them, their terciles crossed: nine bins) a margin is chosen by."""
BINS = 3


def validation_cases(gpu: str) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Every fixed margin on every validation case of ``gpu``: the results (margins, pairs, budgets, latencies,
    seeds, 3: saving %, slowdown %, auto's drift %), each pair's family, and each (pair, seed)'s known quantities."""
    config = load_train_config(f"residual-{gpu}")
    profile = load_profile(gpu)
    pairs = build_pairs(config.data.validation, profile, config.env.grid(profile))
    seeds = score_seeds(pairs)
    with tqdm(total=len(pairs), desc=f"{gpu} validation", unit="pair") as bar:
        results = episodes(margin_actors(), pairs, profile, config.env, seeds, bar.update)
    shapes = config.data.validation.shapes
    workloads = shapes.workloads if shapes is not None else ()
    families = np.array([next((w for w in workloads if p.predicted.name.startswith(f"{w}-")),
                               p.predicted.name.split("-")[0]) for p in pairs])
    error = np.array([[p.executed[s % len(p.executed)].auto_time_s / p.predicted.auto_time_s if p.executed else 1.0
                       for s in range(seeds)] for p in pairs])
    drift_pct = results[0, :, 0, 0, :, 2]
    return results, families, {"scale": error * (1 + drift_pct / 100), "error": error, "drift": drift_pct}


def leave_one_family_out(results: np.ndarray, families: np.ndarray, known: list[np.ndarray]) -> np.ndarray:
    """(pairs, budgets, latencies, seeds, 2) saving and within-budget of the margin chosen for each episode: per
    family left out and cell, on the other families' episodes, over all of them (``known`` empty: the bar) or within
    each bin of ``known`` (each (pairs, seeds); their terciles crossed), the terciles' edges from those families'
    episodes."""
    by_seed = results.transpose(0, 1, 4, 2, 3, 5)  # (margins, pairs, seeds, budgets, latencies, 3)
    ok = within(results).transpose(0, 1, 4, 2, 3)
    out = np.zeros((*by_seed.shape[1:5], 2))
    for family in np.unique(families):
        train, test = families != family, families == family
        bins = np.zeros(by_seed.shape[1:3], dtype=int)
        for quantity in known:
            bins = BINS * bins + np.digitize(quantity, np.quantile(quantity[train], np.linspace(0, 1, BINS + 1)[1:-1]))
        for k in np.unique(bins[test]):
            fit, where = (bins == k) & train[:, None], (bins == k) & test[:, None]
            for b in range(len(CELL_BUDGETS)):
                for s in range(len(CELL_LATENCY_SCALES)):
                    share, saving = ok[:, fit, b, s].mean(axis=1), by_seed[:, fit, b, s, 0].mean(axis=1)
                    pick = int(most_saving_compliant(share, saving)) if fit.any() else -1  # none to choose on: release
                    out[where, b, s, 0] = by_seed[pick][where][:, b, s, 0]
                    out[where, b, s, 1] = ok[pick][where][:, b, s]
    return out.transpose(0, 2, 3, 1, 4)


def summary(scored: np.ndarray, families: np.ndarray) -> dict[str, Any]:
    """Mean saving and within-budget share of ``scored`` (pairs, budgets, latencies, seeds, 2), per cell, and the
    weakest cell x family share."""
    weakest = min(float(scored[families == f, b, s, :, 1].mean()) for f in np.unique(families)
                  for b in range(len(CELL_BUDGETS)) for s in range(len(CELL_LATENCY_SCALES)))
    cells = {f"{100 * budget:g}%/{scale:g}x": {"saved_pct": float(scored[:, b, s, :, 0].mean()),
                                                "within": float(scored[:, b, s, :, 1].mean())}
             for b, budget in enumerate(CELL_BUDGETS) for s, scale in enumerate(CELL_LATENCY_SCALES)}
    return {"saved_pct": float(scored[..., 0].mean()), "within": float(scored[..., 1].mean()),
            "weakest_cell_family": weakest, "cells": cells}


def run_gpu(gpu: str) -> dict[str, Any]:
    """Every method of the module docstring on ``gpu``'s validation cases."""
    results, families, known = validation_cases(gpu)
    methods = {"bar": leave_one_family_out(results, families, [])}
    for names in KNOWN:
        methods[f"by {' and '.join(names)}"] = leave_one_family_out(results, families, [known[n] for n in names])
    ok = within(results)
    bound = np.where(ok > 0, results[..., 0], -np.inf).max(axis=0)
    methods["per-episode bound"] = np.stack([bound, np.ones_like(bound)], axis=-1)
    rows = {name: summary(scored, families) for name, scored in methods.items()}
    gains = {name: float((methods[name][..., 0] - methods["bar"][..., 0]).mean()) for name in methods}
    return {"pairs": int(results.shape[1]), "seeds": int(results.shape[4]), "families": sorted(set(families)),
            "methods": rows, "gain_over_bar_points": gains}


def markdown(result: dict[str, Any]) -> str:
    lines = ["# Room over the bar from what a controller knows ahead of a step (validation pairs, leave one family "
             "out)", "", *provenance_lines(result["provenance"]), ""]
    for gpu, r in result["gpus"].items():
        lines += [f"## {gpu}: {r['pairs']} validation pairs x 9 cells x {r['seeds']} noise seeds "
                  f"(families: {', '.join(r['families'])})", "",
                  "| method | saved % | over the bar (points) | within budget | weakest cell x family |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for name, m in r["methods"].items():
            lines.append(f"| {name} | {m['saved_pct']:.3f} | {r['gain_over_bar_points'][name]:+.3f} | "
                         f"{100 * m['within']:.1f}% | {100 * m['weakest_cell_family']:.1f}% |")
        lines += ["", "Per cell (saved %, within budget):", "",
                  "| method | " + " | ".join(r["methods"]["bar"]["cells"]) + " |",
                  "| --- |" + " ---: |" * len(r["methods"]["bar"]["cells"])]
        for name, m in r["methods"].items():
            lines.append(f"| {name} | " + " | ".join(f"{c['saved_pct']:.2f}, {100 * c['within']:.0f}%"
                                                      for c in m["cells"].values()) + " |")
        lines.append("")
    lines.append(f"Every choice needs >= {COMPLIANCE:.0%} of the other families' episodes within budget (a cell or "
                 "bin where no margin does takes the most compliant); `by scale` is what the runtime can act on; "
                 "`by error`, `by drift` and `by error and drift` split what it sees as one.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", nargs="+", choices=GPUS, default=list(GPUS))
    parser.add_argument("--name", default="margin_information", help="results file stem")
    args = parser.parse_args()
    command = f"python -m benchmarks.learned.margin_information --gpus {' '.join(args.gpus)} --name {args.name}"
    result = {"provenance": provenance(command), "gpus": {gpu: run_gpu(gpu) for gpu in args.gpus}}
    write_results(args.name, result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
