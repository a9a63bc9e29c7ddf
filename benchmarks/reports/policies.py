"""The Markdown report of ``benchmarks/learned/policies.py``: a summary per GPU, then every case."""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.common.provenance import provenance_lines

TARGETS = ("within_budget", "beats_margin_optimum", "share_of_optimum")
METHODS = ("policy", "imitation", "ppo", "fitting-plan", "latency-optimal", "latency-optimal+margin")


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    return f"{row['energy_saved_pct']:.2f} / {row['slowdown_pct']:.2f} / {row['within_budget']:.0%}"


def _mean(cases: list[dict[str, Any]], method: str, key: str) -> float:
    values = [c["rows"][method][key] for c in cases if method in c["rows"]]
    return float(np.mean(values)) if values else float("nan")


def _summary(gpu: str, cases: list[dict[str, Any]], figures: dict[str, Any]) -> list[str]:
    met = {t: sum(c["targets"][t] for c in cases) for t in TARGETS}
    lines = ["", f"## {gpu}", "",
             f"{len(cases)} cases (held-out steps x budgets 0.5/1/2% x latency 0 / own / 2x). Targets met: "
             f"within budget in >= 95% of episodes {met['within_budget']}/{len(cases)}; saving >= the margin-tuned "
             f"optimum's {met['beats_margin_optimum']}/{len(cases)}; >= 90% of the noise-free optimum "
             f"{met['share_of_optimum']}/{len(cases)}.", "",
             "| method | mean saved % | mean slowdown % | mean within budget | mean switches/step |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for method in METHODS:
        lines.append(f"| {method} | {_mean(cases, method, 'energy_saved_pct'):.2f} | "
                     f"{_mean(cases, method, 'slowdown_pct'):.2f} | {_mean(cases, method, 'within_budget'):.0%} | "
                     f"{_mean(cases, method, 'switches'):.1f} |")
    optimum = np.mean([c["noise_free_optimum"]["energy_saved_pct"] for c in cases])
    switches = np.mean([c["noise_free_optimum"]["switches"] for c in cases])
    lines.append(f"| noise-free latency-aware optimum | {optimum:.2f} | - | - | {switches:.1f} |")
    grid, speed, decision = figures["grid"], figures["env_speed"], figures["decision_time"]
    wall = figures.get("train_wall_s")
    lines += ["", f"- grid: {grid['grid_pairs']} pairs; the planners use {grid['pairs_used']} pairs on the held-out "
              f"steps, missing from the grid: {', '.join(grid['missing']) or 'none'}",
              f"- environment, one process, random actions: median {speed['decisions_per_s']:,.0f} decisions/s "
              f"(best round {speed['best_decisions_per_s']:,.0f})",
              f"- frozen policy, one decision ({decision['observation_size']} inputs): median "
              f"{decision['median_s'] * 1e6:.1f} us, p99 {decision['p99_s'] * 1e6:.1f} us",
              f"- shipped: {figures.get('selected')} (PPO - clone return on the validation steps, with its 95% "
              f"interval: {figures.get('selection_comparison')}); "
              f"training {wall / 60 if wall else float('nan'):.1f} min for {figures.get('timesteps')} timesteps"]
    return lines


def _cases_table(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["", "saved % / slowdown % / within budget, means over the episodes; margin: planned budget in brackets",
             "", "| step | budget | latency | policy | imitation | ppo | fitting-plan | latency-optimal | +margin | "
             "noise-free optimum | targets |", "| --- | ---: | ---: " + "| ---: " * 7 + "| --- |"]
    for c in cases:
        rows, margin = c["rows"], c["rows"].get("latency-optimal+margin")
        margin_cell = "-" if margin is None else f"{_cell(margin)} ({margin['planned_budget_pct']:.2g}%)"
        marks = "".join("y" if c["targets"][t] else "n" for t in TARGETS)
        lines.append(f"| {c['step']} | {c['budget_pct']:g}% | {c['latency_ms']:g} ms | {_cell(rows['policy'])} | "
                     f"{_cell(rows.get('imitation'))} | {_cell(rows.get('ppo'))} | {_cell(rows['fitting-plan'])} | "
                     f"{_cell(rows['latency-optimal'])} | {margin_cell} | "
                     f"{c['noise_free_optimum']['energy_saved_pct']:.2f} | {marks} |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    """The whole report."""
    lines = ["# Learned policies on held-out workloads, under disturbances", ""]
    lines += provenance_lines(result["provenance"])
    lines += ["", f"{result['episodes']} seeded episodes per case, every disturbance on, the same draws for every "
              "method. Targets column: within budget >= 95% / saving >= margin-tuned optimum / >= 90% of the "
              "noise-free optimum (y = met)."]
    for gpu, figures in result["gpus"].items():
        cases = [c for c in result["cases"] if c["gpu"] == gpu]
        lines += _summary(gpu, cases, figures) + _cases_table(cases)
    return "\n".join(lines) + "\n"
