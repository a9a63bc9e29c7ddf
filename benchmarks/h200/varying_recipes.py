"""Steps that vary in more than one length on a real GPU (dry runs): encoder-decoder, grad accumulation, packing.

An encoder-decoder, gradient accumulation and sequence packing under the HF Trainer, each captured, planned (on the
GPU's shipped profile) and run for 300 steps.

    python -m benchmarks.h200.varying_recipes run RESULTS_DIR [--cpu-test] [--only encoder-decoder,packing]
    python -m benchmarks.h200.varying_recipes report RESULTS_DIR [--name varying_recipes_h200]  # results/NAME.*

``run`` never changes a clock (NVML through ``benchmarks.common.nvml_guard``). Each recipe is
``examples/hf_sft.py`` as a new user runs it: ``kdvfs capture``, ``kdvfs plan --method latency-optimal
--budget 0.01``, ``kdvfs run --dry-run`` with the default A/B windows. ``report`` reads per recipe the share of
B-window steps controlled (target >= 90%), the dry run's saving and slowdown intervals (truth 0, half-width <= 2
points), the step model's leave-one-shape-out kernel-time error (target within 5%), how many captured steps ran a
shape new to the process and the prediction margin the run planned at, the steps at auto by reason, the capture's
window check (``kdvfs predict``'s, within 5% the aim) and the refused NVML calls; the JSON keeps every A/B window's
record (arm, steps, joules per step, expected kernel time, new inputs) for studying the estimator offline. Recipes
and method: ``docs/design/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from benchmarks.common.kdvfs_command import CLI, run_kdvfs_through
from benchmarks.common.provenance import (
    host,
    local_profile,
    nvidia_smi,
    provenance,
    provenance_lines,
    utc_now,
    write_results,
)
from benchmarks.h200.varying_noise import (
    LONG_STEP_FACTOR,
    TARGET_HALF_WIDTH_PCT,
    during_solves,
    energy_floor,
    host_pace_arm,
    long_steps,
    new_input_covariates,
    steps_for_half_width,
    window_noise,
)
from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.format import load_trace
from kdvfs.runtime.cli.offline.predict import window_check

LENGTHS = ["--lengths", "lognormal", "--median-len", "256", "--min-len", "16", "--max-len", "1024", "--batch", "8"]
CPU_LENGTHS = ["--size", "tiny", "--device", "cpu", "--lengths", "lognormal", "--median-len", "32", "--min-len", "8",
               "--max-len", "96", "--batch", "4"]
RECIPES = {"encoder-decoder": ["--model", "t5"], "grad-accum": ["--model", "llama", "--grad-accum", "2"],
           "packing": ["--model", "llama", "--packing"]}
TARGET_CONTROLLED, TARGET_KERNEL_ERROR_PCT = 0.90, 5.0
WINDOW_CHECK_PCT = 5.0
"""Issue 53's aim for the capture's window check (measured against predicted joules of the unprofiled window)."""


def run_recipe(folder: Path, recipe: str, cpu_test: bool, profile: str) -> list[dict[str, Any]]:
    """Capture, plan (on the GPU profile ``profile``) and the dry run of ``recipe`` into ``folder`` (see the module
    docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = [sys.executable, "examples/hf_sft.py", *RECIPES[recipe], *(CPU_LENGTHS if cpu_test else LENGTHS)]
    nvml = "kdvfs.runtime.testing.nvml" if cpu_test else "benchmarks.common.nvml_guard"
    fake = ["--cpu-test-mode"] if cpu_test else []
    trace, plan = str(folder / "run.trace.json"), str(folder / "plan.json")
    log = [run_kdvfs_through(
        folder, "capture", ["capture", *fake, "--energy-window-s", "1" if cpu_test else "4", "-o", trace,
                            "--json", "--", *script, "--steps", "400"], nvml)]
    command = ["plan", "--trace", trace, "--gpu", profile, "--method", "latency-optimal", "--budget",
               "0.01", "-o", plan]
    done = subprocess.run([sys.executable, "-c", CLI, *command], cwd=REPO_ROOT, capture_output=True, text=True)
    log.append({"label": "plan", "exit_code": done.returncode, "stderr_tail": done.stderr[-2000:]})
    log.append(run_kdvfs_through(
        folder, "run", ["run", "--dry-run", *fake, "--policy", plan, "--trace", trace, "--json",
                        "--log", str(folder / "run.jsonl"), "--", *script, "--steps", "120" if cpu_test else "300"],
        nvml))
    return log


def run(folder: Path, cpu_test: bool, only: list[str] | None) -> None:
    """Every recipe of ``only`` (all by default) into ``folder``; ``folder/run.json`` written before the first and
    after each (a run stopped by a time limit keeps its record)."""
    folder.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {**host(), "date_utc": utc_now(), "log": [],
                              "nvidia_smi": "" if cpu_test else nvidia_smi(), "profile": local_profile(cpu_test)}
    profile = record["profile"]
    for recipe in (r for r in RECIPES if not only or r in only):
        (folder / "run.json").write_text(json.dumps(record, indent=1))
        record["log"] += run_recipe(folder / recipe, recipe, cpu_test, profile)
    (folder / "run.json").write_text(json.dumps(record, indent=1))


def _log(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """The dry run's log records by event (none where it wrote no log)."""
    by_event: dict[str, list[dict[str, Any]]] = defaultdict(list)
    path = folder / "run.jsonl"
    for record in map(json.loads, path.read_text().splitlines() if path.is_file() else []):
        by_event[record["event"]].append(record)
    return by_event


def figures(folder: Path, profile: str | None) -> dict[str, Any]:
    """One recipe's figures (see the module docstring); of a dry run stopped before its summary (the device's
    time ran out), what its log holds. With the GPU profile ``profile``, the capture's window check too
    (``kdvfs predict``'s: :func:`~kdvfs.runtime.cli.offline.predict.window_check`)."""
    capture = json.loads((folder / "capture.out.json").read_text())
    trace = folder / "run.trace.json"
    window = (window_check(str(trace), load_trace(trace), load_profile(profile))
              if profile is not None and trace.is_file() else None)
    log = _log(folder)
    b_windows = [w for w in log["window"] if w["arm"] == "B"]
    b_steps = sum(w["steps"] for w in b_windows)
    errors = (capture.get("shapes") or {}).get("step_model") or []
    both = {"controlled_share_of_b_windows": sum(w["controlled_steps"] for w in b_windows) / b_steps if b_steps
            else None, "step_model": errors, "windows": [{k: v for k, v in w.items() if k != "event"}
                                                        for w in log["window"]],
            "kernel_error_max_pct": max((abs(e["kernel_time_error_pct"]) for e in errors), default=None),
            "window_noise": window_noise(log["window"]), "long_steps": long_steps(log["step"]),
            "during_solves": during_solves(log["step"], log["bucket_planned"]),
            "new_input_covariates": new_input_covariates(log["window"], log["window_energy"]),
            "host_pace_arm": host_pace_arm(log["window"]),
            "window_check": window}
    if not (folder / "run.out.json").is_file():
        return {**both, "cut_short": True, "steps": len(log["step"]),
                "energy_floor": energy_floor(log["window"], log["window_energy"], len(log["step"])),
                "controlled_steps": sum(bool(s["controlled"]) for s in log["step"]), "auto_reasons": None,
                "shapes": None, "measured": {}, "saving_holds_zero": None, "saving_half_width_pct": None,
                "ab_pairs": len(log["pair"]), "error": "stopped before its summary", "refused_nvml_calls": None}
    summary = json.loads((folder / "run.out.json").read_text())
    guard = folder / "run.nvml.json"
    measured = summary.get("measured") or {}
    saving = measured.get("energy_saved_ci95_pct")
    captured = (capture.get("shapes") or {}).get("captured", [])
    half_width_pct = None if saving is None else (saving[1] - saving[0]) / 2
    return {**both, "steps": summary["steps"], "controlled_steps": summary["controlled_steps"],
            "auto_reasons": summary.get("auto_reasons"), "shapes": summary.get("shapes"),
            "measured": measured,
            "saving_holds_zero": None if saving is None else saving[0] <= 0.0 <= saving[1],
            "saving_half_width_pct": half_width_pct,
            "steps_for_target_half_width": steps_for_half_width(summary["steps"], half_width_pct),
            "energy_floor": energy_floor(log["window"], log["window_energy"], summary["steps"]),
            "captured": [c["shape"] for c in captured],
            "captured_first_seen": sum(bool(c.get("first_seen")) for c in captured),
            "capture_step_times_s": {c["shape"]: c["step_time_s"] for c in captured},
            "guard_backoffs": summary["guard_backoffs"], "gpu_restored": summary["gpu_restored"],
            "error": summary["error"],
            "refused_nvml_calls": json.loads(guard.read_text()).get("refused", {}) if guard.is_file() else None}


DEVICE_RUN_KEYS = ("machine", "python", "date_utc", "nvidia_smi", "runs")
"""What the report keeps of the GPU machine's ``run.json`` (``runs``: each recipe's call, where joined by hand)."""


def profile_parameters(profile: str | None) -> dict[str, int] | None:
    """How many of GPU profile ``profile``'s cost-model parameters have each status (``calibrated``, ``estimate``,
    ``placeholder``): the window check tests the cost model only as far as it is calibrated. None without one."""
    if profile is None:
        return None
    return dict(Counter(parameter.status for parameter in load_profile(profile).cost_model.values()))


def report(folder: Path, name: str = "varying_recipes_h200") -> dict[str, Any]:
    """The figures of every recipe run into ``folder``, written to ``benchmarks/results/<name>.*``. Recipes run in
    separate calls are joined by hand: their logs in one ``run.json``, whose ``runs`` maps each recipe to the
    call's date and the revision the GPU machine ran."""
    record = folder / "run.json"
    device = json.loads(record.read_text()) if record.is_file() else {"date_utc": "not recorded (run stopped)"}
    recipes = [r for r in RECIPES if (folder / r / "run.out.json").is_file() or (folder / r / "run.jsonl").is_file()]
    result = {"provenance": provenance(f"python -m benchmarks.h200.varying_recipes run {folder} (on the GPU machine), "
                                       f"then python -m benchmarks.h200.varying_recipes report {folder}"),
              "device_run": {k: device[k] for k in DEVICE_RUN_KEYS if k in device},
              "recipes": {r: figures(folder / r, device.get("profile")) for r in recipes},
              "profile_parameters": profile_parameters(device.get("profile"))}
    write_results(name, result, markdown(result))
    return result


def _counts(by_status: dict[str, int] | None) -> str:
    """``{'estimate': 18}`` as ``18 estimate``; ``-`` without."""
    return ", ".join(f"{count} {status}" for status, count in sorted(by_status.items())) if by_status else "-"


def _pct(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else f"{value:{fmt}}"


def _table_rows(result: dict[str, Any]) -> list[str]:
    """The recipes' table rows."""
    lines: list[str] = []
    for name, r in result["recipes"].items():
        m = r["measured"]
        saving, slow = m.get("energy_saved_ci95_pct"), m.get("slowdown_ci95_pct")
        share = r["controlled_share_of_b_windows"]
        saving_text = "" if saving is None else f"[{saving[0]:+.2f}, {saving[1]:+.2f}]"
        slow_text = "" if slow is None else f"[{slow[0]:+.2f}, {slow[1]:+.2f}]"
        if r.get("cut_short"):
            lines.append(f"| {name} (stopped at step {r['steps']} of 300: no summary) | {r['steps']} | "
                         f"{r['controlled_steps']} | {'-' if share is None else f'{share:.0%}'} | "
                         f"- ({r['ab_pairs']} A/B pairs) | - | - | {_pct(r['kernel_error_max_pct'])} | - | - | - | - | "
                         "- |")
            continue
        lines.append(
            f"| {name} | {r['steps']} | {r['controlled_steps']} | {'-' if share is None else f'{share:.0%}'} | "
            f"{_pct(m.get('energy_saved_pct'), '+.2f')} {saving_text} | {_pct(r['saving_half_width_pct'], '.2f')} | "
            f"{_pct(m.get('slowdown_pct'), '+.2f')} {slow_text} | {_pct(r['kernel_error_max_pct'])} | "
            f"{r.get('captured_first_seen', '-')} of {len(r['captured'])} | "
            f"{_pct((r['shapes'] or {}).get('prediction_margin'), '.2f')} | {r['auto_reasons']} | "
            f"{(r['shapes'] or {}).get('planned_in_background')} | {r['refused_nvml_calls']} |")
    return lines


def _noise_lines(result: dict[str, Any]) -> list[str]:
    """What the A/B interval is up against, recipe by recipe."""
    lines = ["", "What the A/B interval is up against (windows' records; `window_noise`):", ""]
    for name, r in result["recipes"].items():
        noise = r.get("window_noise")
        if noise:
            lines.append(f"- {name}: inputs of a shape new to the process {noise['new_inputs'][0]:.2f}-"
                         f"{noise['new_inputs'][1]:.2f} a step of a window; window step time vs expected kernel time "
                         f"correlation {noise['step_time_vs_kernel_correlation']:.2f}; adjusted residual "
                         f"{noise['adjusted_residual_pct']:.1f}% of the mean step time; a half-width of "
                         f"{TARGET_HALF_WIDTH_PCT:g} points would take about "
                         f"{r.get('steps_for_target_half_width') or '-'} steps at this noise (an upper estimate: "
                         "`steps_for_half_width`)")
        floor = r.get("energy_floor")
        if floor:
            lines.append(f"  - joules per step left after the regression {floor['residual_pct']:.1f}% of the mean "
                         f"({floor['windows']} windows); the least half-width of any estimate from these windows at "
                         f"this noise (arms half and half, no robust widening) {floor['floor_half_width_pct']:.2f} "
                         f"points; {TARGET_HALF_WIDTH_PCT:g} points would take at least about "
                         f"{floor['steps_for_target']} steps (`energy_floor`)")
        forms = r.get("new_input_covariates")
        if forms:
            lines.append("  - the saving under each form of the covariates, on the same windows: " + "; ".join(
                f"{name} {form['saving_pct']:+.2f}%, half-width {form['half_width_pct']:.2f}"
                for name, form in forms.items()) + " (run is the run's)")
        pace = r.get("host_pace_arm")
        if pace:
            lines.append(f"  - host pace {1e3 * pace['mean_s']:.3f} ms, {pace['cv_pct']:.1f}% from window to window; "
                         f"controlled windows' against auto's {pace['effect_pct']:+.2f}% [{pace['ci95_pct'][0]:+.2f}, "
                         f"{pace['ci95_pct'][1]:+.2f}] (`host_pace_arm`: the controller's own host work, unresolved "
                         "at this jitter)")
        long = r.get("long_steps")
        if long and long["count"]:
            lines.append(f"  - long steps (over {LONG_STEP_FACTOR:g} x the median GPU step time, "
                         f"{long['median_s']:.3f} s): {long['count']} (median {long['long_median_s']:.3f} s), at steps "
                         f"{', '.join(map(str, long['steps']))}; buckets planned in the background: "
                         f"{(r.get('shapes') or {}).get('planned_in_background')}")
        solves = r.get("during_solves")
        if solves:
            lines.append(f"  - steps during the {solves['solves']} background solves (median "
                         f"{solves['solve_s_median']:.2f} s each): {solves['steps_during']}, median "
                         f"{solves['median_s_during']:.3f} s; the other {solves['steps_other']}: "
                         f"{solves['median_s_other']:.3f} s (`during_solves`; a first look: their shapes differ)")
    return lines


def _window_check_lines(result: dict[str, Any]) -> list[str]:
    """The captures' window check, recipe by recipe (none without one)."""
    lines: list[str] = []
    checks = {name: r["window_check"] for name, r in result["recipes"].items() if r.get("window_check")}
    if checks:
        lines += ["", "The captures' window check (`kdvfs predict`: the unprofiled window's measured joules (and "
                  "seconds) against the sum of its steps' predicted joules (seconds) at auto, a shape not captured "
                  "scaled from the "
                  "nearest by size; "
                  f"the aim within {WINDOW_CHECK_PCT:g}%; the profile's cost-model parameters by status: "
                  f"{_counts(result.get('profile_parameters'))}):", ""]
        lines += [f"- {name}: measured {c['measured_j']:.1f} J, predicted {c['predicted_j']:.1f} J "
                  f"({100 * c['error']:+.1f}%) over {c['steps']:.0f} steps, {c['captured_steps']:.0f} of a captured "
                  "shape" + ("" if c.get("time_error") is None else f"; measured {c['measured_s']:.2f} s, predicted "
                             f"{c['predicted_s']:.2f} s ({100 * c['time_error']:+.1f}%)")
                  + ("" if c.get("stall_s") is None else f"; stalls {c['stall_s']:.2f} s (as measured, idle)")
                  for name, c in checks.items()]
    return lines


def markdown(result: dict[str, Any]) -> str:
    smi = result["device_run"].get("nvidia_smi", "").splitlines()
    gpu = smi[1].split(",")[0] if len(smi) > 1 else "H200"
    lines = [f"# Steps that vary in more than one length on the {gpu} (dry runs of 300 steps)", "",
             *provenance_lines(result["provenance"]),
             f"- device run: `{result['device_run'].get('machine')}`, {result['device_run'].get('date_utc')}",
             *(f"  - {recipe}: {run}" for recipe, run in result["device_run"].get("runs", {}).items()), "",
             "| recipe | steps | controlled | of B-window steps | dry-run saving % [95%] (truth 0) | half-width | "
             "slowdown % [95%] | step model max kernel-time error % | captured steps first seen | prediction margin | "
             "auto reasons | background plans | refused |",
             "| --- | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | --- | ---: | --- |"]
    lines += [*_table_rows(result), *_noise_lines(result), *_window_check_lines(result)]
    lines += ["", f"Targets: >= {TARGET_CONTROLLED:.0%} of the B-window steps controlled; the dry-run saving interval "
              f"holds 0 with a half-width <= {TARGET_HALF_WIDTH_PCT:g} points; step-model kernel time within "
              f"{TARGET_KERNEL_ERROR_PCT:g}% leave-one-shape-out; no refused NVML call."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("run", "report"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--cpu-test", action="store_true")
    parser.add_argument("--only", type=lambda text: text.split(","), default=None, help="recipes, e.g. packing")
    parser.add_argument("--name", default="varying_recipes_h200", help="report: results file stem")
    args = parser.parse_args()
    if args.stage == "run":
        run(args.folder, args.cpu_test, args.only)
    else:
        print(markdown(report(args.folder, args.name)))


if __name__ == "__main__":
    main()
