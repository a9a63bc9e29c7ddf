"""evaluate --reference on held-out H200 shapes of three families: savings and steps within a 1% budget.

reference-plan, policy, prediction-optimum and oracle, at 0 ms and at the profile's switching latency.

For each family (llama, mixtral, bert: ``data/traces/h200/workloads``) each captured shape in turn is the
executed step and the family's other shapes are the references (the step model is fitted on them; the
executed step is never shown to the controller side). The shipped ``policies/h200`` policy, or each policy of
``--policy`` (a shipped name or a file, e.g. the residual seeds ``benchmarks/data/learned/h200-s*.kdvfs-policy.npz``,
none trained on these families); ``of oracle``: the policy's mean saving over the oracle's. All but the oracle plan
and decide at the budget times the references' prediction margin (``kdvfs.agents.planners.prediction_margin``).

    python -m benchmarks.learned.shapes_h200 [--episodes N] [--policy NAME_OR_PATH ...] [--name NAME]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.common.provenance import provenance, provenance_lines, write_results
from benchmarks.model.step_model import FAMILIES, WORKLOADS, family_traces
from kdvfs.agents.learned.policy.frozen import FrozenPolicy
from kdvfs.agents.learned.policy.shipped import policy_source_path
from kdvfs.agents.learned.shape_evaluation import METHODS, evaluate_shapes
from kdvfs.agents.planners.prediction_margin import PredictionMargin, prediction_margin
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.step_model import AlignedSteps

BUDGET = 0.01


Margins = dict[tuple[str, int, float | None], PredictionMargin]
"""The prediction margin of each (family, executed index, latency): the same for every policy."""


def _family(family: str, policy: FrozenPolicy, latency_s: float | None, episodes: int | None,
            margins: Margins) -> dict[str, Any]:
    profile = load_profile("h200")
    traces = family_traces(family)
    names = sorted(path.name for path in WORKLOADS.glob(f"{family}-*.trace.json.gz"))
    steps = []
    for index, executed in enumerate(traces):
        references = [t for i, t in enumerate(traces) if i != index]
        key = (family, index, latency_s)
        if key not in margins:
            margins[key] = prediction_margin(AlignedSteps.of(references), profile, BUDGET, latency_s)
        rows = evaluate_shapes(policy, references, [(names[index], executed)], profile, BUDGET, latency_s,
                               episodes, margin=margins[key])["steps"]
        steps += [{**row, "prediction_margin": margins[key].margin} for row in rows]  # type: ignore[attr-defined]
    return {"family": family, "steps": steps}


def _summary(steps: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out = {}
    for method in METHODS:
        rows = [s["methods"][method] for s in steps]
        out[method] = {"energy_saved_pct": sum(r["energy_saved_pct"] for r in rows) / len(rows),
                       "slowdown_pct": sum(r["slowdown_pct"] for r in rows) / len(rows),
                       "within_budget_share": sum(r["within_budget"] for r in rows) / len(rows)}
    return out


def _markdown(result: dict[str, Any]) -> str:
    episodes = result["episodes"]
    lines = [f"# evaluate --reference on held-out shapes (H200, 1% budget, "
             f"{f'{episodes} disturbed episodes' if episodes else 'one undisturbed episode'} a step)", "",
             *provenance_lines(result["provenance"]), "",
             "| policy | latency | method | energy saved | slowdown | steps within budget | of oracle |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for run in result["runs"]:
        lines += _rows(run["policy"], run["latency"], run["summary"])
    lines += ["", "On the steps whose shape the step model covers (the others run at auto but for `oracle`):", "",
              "| policy | latency | covered steps | method | energy saved | slowdown | steps within budget | "
              "of oracle |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in result["runs"]:
        count = f"{run['covered']['steps']} of {run['covered']['of']}"
        lines += _rows(run["policy"], f"{run['latency']} | {count}", run["covered"]["summary"])
    lines += ["", "Each step (the first policy's runs): its prediction margin and each method's saving / slowdown:", "",
              "| latency | executed | covered | margin | " + " | ".join(METHODS[1:]) + " |",
              "| --- | --- | --- | --- | " + " | ".join("---" for _ in METHODS[1:]) + " |"]
    for run in result["runs"]:
        if run["policy"] != result["runs"][0]["policy"]:
            continue
        for step in (s for family in run["families"] for s in family["steps"]):
            cells = [f"{step['methods'][m]['energy_saved_pct']:.2f}% / {step['methods'][m]['slowdown_pct']:.2f}%"
                     for m in METHODS[1:]]
            lines.append(f"| {run['latency']} | {step['trace'].removesuffix('.trace.json.gz')} | "
                         f"{'yes' if step['covered'] else 'no'} | {step['prediction_margin']:.2f} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _rows(policy: str, where: str, summary: dict[str, dict[str, float]]) -> list[str]:
    """One table row per method of ``summary``."""
    oracle, rows = summary["oracle"]["energy_saved_pct"], []
    for method, row in summary.items():
        share = f"{row['energy_saved_pct'] / oracle:.0%}" if oracle > 0 else "-"
        rows.append(f"| {policy} | {where} | {method} | {row['energy_saved_pct']:.2f}% | {row['slowdown_pct']:.2f}% | "
                    f"{row['within_budget_share']:.0%} | {share} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, help="disturbed episodes per step (default: one, undisturbed)")
    parser.add_argument("--name", default="shapes_h200", help="the result files' name (benchmarks/results/NAME.*)")
    parser.add_argument("--policy", nargs="+", default=["h200"], help="policies to score: shipped names or files "
                        "(default: the shipped h200)")
    args = parser.parse_args()
    profile = load_profile("h200")
    runs, margins = [], {}
    for source in args.policy:
        policy = FrozenPolicy.load(policy_source_path(source), profile)
        name = Path(source).name.removesuffix(".kdvfs-policy.npz")
        for label, latency_s in (("0 ms", 0.0), ("profile", None)):
            families = [_family(family, policy, latency_s, args.episodes, margins) for family in FAMILIES]
            steps = [step for family in families for step in family["steps"]]
            covered = [step for step in steps if step["covered"]]
            runs.append({"policy": name, "latency": label, "families": families, "summary": _summary(steps),
                         "covered": {"steps": len(covered), "of": len(steps), "summary": _summary(covered)},
                         "by_family": {f["family"]: _summary(f["steps"]) for f in families}})
    command = ("python -m benchmarks.learned.shapes_h200" + (f" --episodes {args.episodes}" if args.episodes else "")
               + (f" --name {args.name}" if args.name != "shapes_h200" else "")
               + (f" --policy {' '.join(args.policy)}" if args.policy != ["h200"] else ""))
    result = {"provenance": provenance(command), "budget": BUDGET, "episodes": args.episodes, "runs": runs}
    write_results(args.name, result, _markdown(result))


if __name__ == "__main__":
    main()
