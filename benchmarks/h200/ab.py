"""The A/B measurement in dry runs on a real GPU: eager GPT-3 XL and a torch.compile'd GPT-2 small.

    python -m benchmarks.h200.ab run RESULTS_DIR [--seconds 135]   # on the GPU machine: dry runs only
    python -m benchmarks.h200.ab report RESULTS_DIR                # anywhere: benchmarks/results/ab_h200.{json,md}

``run`` never changes a clock: both controllers are ``kdvfs run --dry-run`` with the NVML binding
``benchmarks.common.nvml_guard`` (the real pynvml; any Set/Reset call is refused and counted). Each trains for
``--seconds`` of steps (from the expected step time) with the default A/B settings and logs to
``RESULTS_DIR/<label>.jsonl``:

1. ``gpt3xl-eager``: ``examples/gpt.py --size gpt3xl --batch 4`` with the shipped H200 policy on the bundled
   capture ``h200/capture-gpt3xl-b4``;
2. ``gpt2s-compiled``: ``examples/gpt.py --size gpt2s --batch 16 --compile``, captured first here
   (``kdvfs capture``, read-only: its unprofiled step time is the no-controller reference), planned
   (latency-optimal, 1%), then run.

In a dry run no clock changes, so the true saving and slowdown are 0: the targets are an interval that
holds 0 with a half-width <= 0.5%, no back-off, and step time within 1% of the reference.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common.provenance import host, nvidia_smi, provenance, provenance_lines, utc_now, write_results
from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.trace.bundled import open_trace

KDVFS = [sys.executable, "-c", "import sys; from kdvfs.runtime.cli import main; sys.exit(main(sys.argv[1:]))"]
GUARD = "benchmarks.common.nvml_guard"
EAGER = ["examples/gpt.py", "--size", "gpt3xl", "--batch", "4"]
COMPILED = ["examples/gpt.py", "--size", "gpt2s", "--batch", "16", "--compile"]


def _kdvfs(*args: str, stdout: Path | None = None) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    with open(stdout, "w") if stdout else open(os.devnull, "w") as out:
        subprocess.run([*KDVFS, *args], cwd=REPO_ROOT, check=True, env=env, stdout=out)


def _dry_run(folder: Path, label: str, policy: str, trace: str, script: list[str], seconds: float) -> dict[str, Any]:
    step_s = float(open_trace(trace).meta.measurements["step_time_s"])
    steps = math.ceil(seconds / step_s) + 30
    start_s = time.perf_counter()
    _kdvfs("run", "--dry-run", "--json", "--policy", policy, "--trace", trace, "--nvml-module", GUARD, "--log",
           str(folder / f"{label}.jsonl"), "--", sys.executable, *script, "--steps", str(steps),
           stdout=folder / f"{label}.summary.json")
    return {"label": label, "policy": policy, "trace": trace, "script": script, "steps": steps,
            "reference_step_s": step_s, "wall_s": time.perf_counter() - start_s}


def run(folder: Path, seconds: float) -> None:
    """Both dry runs into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    log: dict[str, Any] = {**host("benchmarks.h200.ab"),
                           "started_utc": utc_now(), "nvidia_smi_before": nvidia_smi(header=False), "runs": []}
    log["runs"].append(_dry_run(folder, "gpt3xl-eager", "policies/h200.kdvfs-policy.npz", "h200/capture-gpt3xl-b4",
                                EAGER, seconds))
    (folder / "run.json").write_text(json.dumps(log, indent=1))
    trace, plan = folder / "gpt2s-compiled.trace.json", folder / "gpt2s-compiled.plan.json"
    _kdvfs("capture", "--steps", "3", "-o", str(trace), "--", sys.executable, *COMPILED, "--steps", "400")
    _kdvfs("plan", "--trace", str(trace), "--gpu", "h200", "--method", "latency-optimal", "--budget", "0.01",
           "-o", str(plan))
    log["runs"].append(_dry_run(folder, "gpt2s-compiled", str(plan), str(trace), COMPILED, seconds))
    log["nvidia_smi_after"], log["finished_utc"] = nvidia_smi(header=False), utc_now()
    (folder / "run.json").write_text(json.dumps(log, indent=1))


def _figures(folder: Path, entry: dict[str, Any]) -> dict[str, Any]:
    summary = json.loads((folder / f"{entry['label']}.summary.json").read_text())
    measured, (s_lo, s_hi) = summary["measured"], summary["measured"]["slowdown_ci95_pct"] or (None, None)
    e_lo, e_hi = measured["energy_saved_ci95_pct"] or (None, None)
    step_s = summary["step_time_s"]
    overhead = None if step_s is None else (step_s / entry["reference_step_s"] - 1) * 100
    return {"label": entry["label"], "measured": measured, "backed_off": summary["backed_off"],
            "saved_contains_0": e_lo is not None and e_lo <= 0 <= e_hi,
            "saved_half_width_pct": None if e_lo is None else (e_hi - e_lo) / 2,
            "slowdown_contains_0": s_lo is not None and s_lo <= 0 <= s_hi,
            "slowdown_half_width_pct": None if s_lo is None else (s_hi - s_lo) / 2,
            "overhead_pct": overhead, "steps": summary["steps"], "energy_reads": summary["energy_reads"],
            "switches_logged": summary["switches"], "mismatches": summary["mismatches"]}


def _row(f: dict[str, Any]) -> str:
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}%"

    def interval(value: float | None, bounds: list[float] | None) -> str:
        return "-" if value is None or bounds is None else f"{value:+.3f} [{bounds[0]:+.3f}, {bounds[1]:+.3f}]"

    m = f["measured"]
    return (f"| {f['label']} | {interval(m['energy_saved_pct'], m['energy_saved_ci95_pct'])} | "
            f"{pct(f['saved_half_width_pct'])} | {interval(m['slowdown_pct'], m['slowdown_ci95_pct'])} | "
            f"{pct(f['slowdown_half_width_pct'])} | {m['windows_auto']} / "
            f"{m['windows_controlled']} | {f['backed_off']} | {pct(f['overhead_pct'])} |")


def report(folder: Path) -> None:
    """``benchmarks/results/ab_h200.{json,md}`` from the files ``run`` wrote."""
    log = json.loads((folder / "run.json").read_text())
    figures = [_figures(folder, entry) for entry in log["runs"]]
    document = {"provenance": {**provenance(log["command"]), "machine": log["machine"], "python": log["python"],
                               "date_utc": log["started_utc"]},
                "nvidia_smi": log["nvidia_smi_before"], "runs": figures}
    markdown = "\n".join([
        "# A/B measurement on an H200, dry runs", "", *provenance_lines(document["provenance"]),
        f"- GPU: `{log['nvidia_smi_before']}`", "",
        "| run | saved % [95%] | half-width | slowdown % [95%] | half-width | windows A / B | backed off | "
        "overhead vs no controller |", "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *map(_row, figures), "",
        "Targets: both intervals hold 0 (no clock changed), half-width <= 0.5%, no back-off, overhead <= 1%.", ""])
    write_results("ab_h200", document, markdown)
    print(markdown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run_parser = sub.add_parser("run")
    run_parser.add_argument("folder", type=Path)
    run_parser.add_argument("--seconds", type=float, default=135.0)
    sub.add_parser("report").add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.what == "run":
        run(args.folder, args.seconds)
    else:
        report(args.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
