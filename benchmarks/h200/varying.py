"""Steps that vary on the H200 (dry run): a dynamic-padding SFT's steps controlled, controller time, GPU restored.

    python -m benchmarks.h200.varying run RESULTS_DIR [--cpu-test] [--only no-ab]   # on the GPU machine: dry runs
    python -m benchmarks.h200.varying report RESULTS_DIR             # anywhere: benchmarks/results/varying_h200.*

``run`` never changes a clock (NVML through ``benchmarks.common.nvml_guard``, which refuses every Set/Reset/Clear call).
It captures the Hugging Face ``Trainer`` SFT of ``examples/hf_sft.py`` (12-layer Llama, batch 8, dynamic
padding: sample lengths 64-1024, each batch padded to its longest) with ``kdvfs capture`` (several shapes of
the run, ``NAME.shape-K`` beside the trace), plans it (``kdvfs plan --method latency-optimal --budget 0.01``),
and runs the same script for 300 steps under ``kdvfs run --dry-run`` twice: with the default A/B windows (a
quarter of the windows at auto, the guard on) and with ``--ab-share 0`` (every step the controller may take).

``report`` reads each run's summary: steps, controlled steps, steps with a shape bucket (``shapes``), the
guard's back-offs, the controller thread's CPU time per step, whether the GPU was restored, and the NVML calls
the guard refused. Targets (issue 41): >= 90% of the steps controlled (the A/B run: of the steps in controlled
windows), GPU restored, guard quiet, no refused call.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common.kdvfs_command import CLI, run_kdvfs_through
from benchmarks.common.provenance import host, nvidia_smi, provenance, provenance_lines, utc_now, write_results
from kdvfs.common.paths import REPO_ROOT

SCRIPT = ["examples/hf_sft.py", "--model", "llama"]
CPU_SCRIPT = [*SCRIPT, "--size", "tiny", "--device", "cpu", "--min-len", "16", "--max-len", "128", "--batch", "4"]
RUNS = {"ab": [], "no-ab": ["--ab-share", "0"]}
TARGET_CONTROLLED = 0.90


def run(folder: Path, cpu_test: bool, only: list[str] | None = None) -> None:
    """Capture, plan and the dry runs (``only`` those of ``RUNS`` named) into ``folder`` (see the module
    docstring); a folder that already holds ``sft.trace.json`` and ``plan.json`` is not captured again."""
    folder.mkdir(parents=True, exist_ok=True)
    script = [sys.executable, *(CPU_SCRIPT if cpu_test else SCRIPT)]
    nvml = "kdvfs.runtime.testing.nvml" if cpu_test else "benchmarks.common.nvml_guard"
    fake = ["--cpu-test-mode"] if cpu_test else []
    trace, plan = str(folder / "sft.trace.json"), str(folder / "plan.json")
    log: list[dict[str, Any]] = []
    if not (folder / "plan.json").is_file():  # a folder holding a capture and its plan runs them again
        log.append(run_kdvfs_through(
            folder, "capture", ["capture", *fake, "--energy-window-s", "1" if cpu_test else "4", "-o", trace, "--json",
                                "--", *script, "--steps", "400"], nvml))
        done = subprocess.run([sys.executable, "-c", CLI, "plan", "--trace", trace, "--gpu", "h200", "--method",
                               "latency-optimal", "--budget", "0.01", "-o", plan], cwd=REPO_ROOT,
                              capture_output=True, text=True)
        log.append({"label": "plan", "exit_code": done.returncode, "stderr_tail": done.stderr[-2000:]})
    for label, options in RUNS.items():
        if only and label not in only:
            continue
        log.append(run_kdvfs_through(
            folder, label, ["run", "--dry-run", *fake, "--policy", plan, "--trace", trace, *options, "--json",
                            "--log", str(folder / f"{label}.jsonl"), "--", *script,
                            "--steps", "120" if cpu_test else "300"], nvml))
    (folder / "run.json").write_text(json.dumps({**host(), "date_utc": utc_now(), "log": log,
                                                 "nvidia_smi": "" if cpu_test else nvidia_smi()}, indent=1))


def _figures(folder: Path, label: str) -> dict[str, Any]:
    summary = json.loads((folder / f"{label}.out.json").read_text())
    guard = folder / f"{label}.nvml.json"
    refused = json.loads(guard.read_text()).get("refused", {}) if guard.is_file() else None
    shapes = summary.get("shapes") or {}
    steps = summary["steps"]
    b_windows = [w for w in _windows(folder, label) if w["arm"] == "B"]
    b_steps = sum(w["steps"] for w in b_windows)
    return {"steps": steps, "controlled_steps": summary["controlled_steps"],
            "controlled_share": summary["controlled_steps"] / steps if steps else None,
            "controlled_share_of_b_windows": None if not b_steps else
            sum(w["controlled_steps"] for w in b_windows) / b_steps,
            "planned_steps": sum((shapes.get("steps_by_bucket") or {}).values()), "shapes": shapes,
            "guard_backoffs": summary["guard_backoffs"], "gpu_restored": summary["gpu_restored"],
            "error": summary["error"], "mismatches": summary["mismatches"],
            "thread_cpu_us_per_step": 1e3 * summary["controller_cpu_ms"]["thread"] / steps if steps else None,
            "measured": summary.get("measured"), "refused_nvml_calls": refused}


def _windows(folder: Path, label: str) -> list[dict[str, Any]]:
    path = folder / f"{label}.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == "window"] \
        if path.is_file() else []


def report(folder: Path) -> dict[str, Any]:
    device = json.loads((folder / "run.json").read_text())
    capture = json.loads((folder / "capture.out.json").read_text())
    runs = [label for label in RUNS if (folder / f"{label}.out.json").is_file()]
    reused = "" if (folder / "capture.nvml.json").is_file() else \
        " with the capture and plan of benchmarks/data/varying_h200 copied into it (gunzipped)"
    result = {"provenance": provenance(f"python -m benchmarks.h200.varying run {folder} --only {','.join(runs)} (on "
                                       f"the GPU machine{reused}), then python -m benchmarks.h200.varying report "
                                       f"{folder}"),
              "device_run": {k: device[k] for k in ("machine", "python", "date_utc", "nvidia_smi") if k in device},
              "capture": capture.get("shapes"),
              "runs": {label: _figures(folder, label) for label in runs}}
    write_results("varying_h200", result, markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = ["# Steps that vary on the H200: a dynamic-padding SFT under the controller (dry run)", "",
             *provenance_lines(result["provenance"]),
             f"- device run: `{result['device_run'].get('machine')}`, {result['device_run'].get('date_utc')}", "",
             "| run | steps | with a bucket | controlled | controlled in B windows | guard back-offs | thread CPU "
             "us/step | GPU restored | refused NVML calls |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for label, r in result["runs"].items():
        share_b = r["controlled_share_of_b_windows"]
        lines.append(f"| {label} | {r['steps']} | {r['planned_steps']} | {r['controlled_steps']} "
                     f"({r['controlled_share']:.0%}) | {'-' if share_b is None else f'{share_b:.0%}'} | "
                     f"{r['guard_backoffs']} | {r['thread_cpu_us_per_step']:.0f} | {r['gpu_restored']} | "
                     f"{r['refused_nvml_calls']} |")
    captured = result["capture"] or {}
    lines += ["", f"Capture: {len(captured.get('seen', []))} shapes in {captured.get('window_steps')} window steps "
              f"({captured.get('tokens_range')} tokens), {len(captured.get('captured', []))} captured.",
              f"Target: >= {TARGET_CONTROLLED:.0%} of the steps controlled, GPU restored, guard quiet, no refused "
              "call."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("run", "report"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--cpu-test", action="store_true")
    parser.add_argument("--only", type=lambda text: text.split(","), default=None, help="runs of RUNS, e.g. no-ab")
    args = parser.parse_args()
    if args.stage == "run":
        run(args.folder, args.cpu_test, args.only)
    else:
        print(markdown(report(args.folder)))


if __name__ == "__main__":
    main()
