"""Capture and calibrate on a real GPU, then compare the cost model's predictions with the measurements.

Two steps, because only the first needs the GPU:

    python -m benchmarks.h200.capture run RESULTS_DIR      # on the GPU machine (read-only NVML, profiler)
    python -m benchmarks.h200.capture report RESULTS_DIR   # anywhere: writes benchmarks/results/capture_h200.*

``run`` captures three example workloads with ``kdvfs capture`` (GPT-3-XL-sized LM, GPT-2 small, a
ResNet-50-like CNN), runs the read-only ``kdvfs calibrate`` and checks ``kdvfs capture --ncu`` on a tiny
model; every command, its output and its wall time go to RESULTS_DIR. ``--cpu-test`` runs the same on a
CPU with tiny models and the fake NVML of the tests (a dry run of this script). ``report`` predicts each
captured trace's joules per step in auto mode with the shipped H200 profile and with the calibrated one,
and scores the calibrated profile on the bundled H200 microbenchmarks and workloads.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.kdvfs_command import run_kdvfs
from benchmarks.common.provenance import host, nvidia_smi, utc_now, write_results
from kdvfs.common.paths import DATA_DIR
from kdvfs.envs.calibration.fit import predict_power_w
from kdvfs.envs.calibration.sweep import load_sweep
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile
from kdvfs.envs.model.cost_model import ClockLimits, CostParams
from kdvfs.envs.model.cost_tables import build_tables, step_breakdown
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.trace import Trace

WORKLOADS = {
    "gpt3xl-b4": ["examples/gpt.py", "--size", "gpt3xl", "--batch", "4", "--steps", "300"],
    "gpt2s-b16": ["examples/gpt.py", "--size", "gpt2s", "--batch", "16", "--steps", "1000"],
    "resnet50-b128": ["examples/vision.py", "--size", "resnet50", "--batch", "128", "--steps", "1000"],
}
CPU_WORKLOADS = {
    "gpt-tiny": ["examples/gpt.py", "--size", "tiny", "--device", "cpu", "--steps", "60"],
    "vision-tiny": ["examples/vision.py", "--size", "tiny", "--device", "cpu", "--steps", "60"],
}
BUNDLED = {"gpt3xl": "h200/gpt3xl-24layer-b4", "gpt2s": "h200/gpt2s-b16", "resnet50": "h200/resnet50-b128"}
TARGET = 0.10


def run(folder: Path, cpu_test: bool) -> None:
    """All GPU-side measurements into ``folder`` (see the module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    fake = ["--cpu-test-mode", "--nvml-module", "kdvfs.runtime.testing.nvml"] if cpu_test else []
    window = "0.5" if cpu_test else "6"
    log = []
    for label, script in (CPU_WORKLOADS if cpu_test else WORKLOADS).items():
        log.append(run_kdvfs(folder, label, ["capture", "--steps", "2", "--warmup", "5", "--energy-window-s", window,
                                          "--workload", label, "-o", str(folder / f"{label}.trace.json"), "--json",
                                          *fake, "--", "python3", *script]))
    device = ["--device", "cpu", "--scale", "0.02", "--duration-s", "0.2", "--nvml-module",
              "kdvfs.runtime.testing.nvml"] if cpu_test else []
    calibrated = str(folder / "h200-calibrated.yaml")
    log.append(run_kdvfs(folder, "calibrate", ["calibrate", "--gpu-index", "0", "-o", calibrated, "--save-sweep",
                                               str(folder / "h200-calibrated.sweep.csv"), "--json", *device]))
    if not cpu_test:
        log.append(run_kdvfs(folder, "ncu-tiny", ["capture", "--ncu", "--no-energy", "--energy-window-s", "0.5",
                                               "--keep-profile", str(folder / "ncu-tiny.profile.json.gz"),
                                               "-o", str(folder / "ncu-tiny.trace.json"), "--json", "--", "python3",
                                               "examples/gpt.py", "--size", "tiny", "--steps", "5000"]))
    environment = {**host(), "date_utc": utc_now(), "log": log, "nvidia_smi": nvidia_smi()}
    (folder / "run.json").write_text(json.dumps(environment, indent=1))


def auto_step(trace: Trace, profile: GpuProfile) -> dict[str, Any]:
    """Predicted step in auto mode at the default memory clock (what ``kdvfs predict`` prints first)."""
    tables = build_tables(trace, profile)
    return step_breakdown(trace, tables, tables.auto_time_s[:, 0], tables.auto_energy_j[:, 0],
                          tables.auto_gap_power_w[:, 0])


def _energy_errors(traces: dict[str, Trace], profiles: dict[str, GpuProfile]) -> dict[str, Any]:
    report = {}
    for label, trace in traces.items():
        measured = trace.meta.measurements["energy_j_per_step"]
        report[label] = {"measured_j": measured, "measured_step_s": trace.meta.measurements["step_time_s"]}
        for name, profile in profiles.items():
            step = auto_step(trace, profile)
            report[label][name] = {"predicted_j": step["energy_j"], "error": step["energy_j"] / measured - 1,
                                   "predicted_step_s": step["step_time_s"]}
    return report


def _microbenchmark_errors(profiles: dict[str, GpuProfile], path: Path) -> dict[str, Any]:
    """Power error of each row of a default-clock sweep from its utilisations (as in cost_model_validation)."""
    sweep = load_sweep(path)
    report: dict[str, Any] = {}
    for name, profile in profiles.items():
        scoped = replace(sweep, grid_limits=ClockLimits.of(profile))
        predicted = predict_power_w(CostParams.from_profile(profile), scoped, scoped.time_s, reference_power=False)
        errors = predicted / scoped.power_w - 1
        report[name] = {kernel: float(errors[i]) for i, kernel in enumerate(sweep.kernel_names)}
    return report


def report(folder: Path) -> dict[str, Any]:
    """Predictions vs measurements of a ``run`` folder; writes benchmarks/results/capture_h200.{json,md}."""
    captures = {p.name.removesuffix(".trace.json"): p for p in sorted(folder.glob("*.trace.json"))
                if not p.name.startswith("ncu-")}
    profiles = {"shipped": load_profile("h200"), "calibrated": load_profile(folder / "h200-calibrated.yaml")}
    result = {
        "provenance": {"command": f"python -m benchmarks.h200.capture run {folder} (on the GPU machine), then "
                                  f"python -m benchmarks.h200.capture report {folder}",
                       "device_run": json.loads((folder / "run.json").read_text()), "report_machine": host()["machine"],
                       "report_date_utc": utc_now()},
        "captures": {label: json.loads((folder / f"{label}.out.json").read_text()) for label in captures},
        "energy_per_step": _energy_errors({label: load_trace(p) for label, p in captures.items()}, profiles),
        "bundled_energy_per_step": _energy_errors({k: open_trace(v) for k, v in BUNDLED.items()}, profiles),
        "microbenchmarks": _microbenchmark_errors(profiles, DATA_DIR / "sweeps" / "h200-default.sweep.csv"),
        "new_microbenchmarks": _microbenchmark_errors(profiles, folder / "h200-calibrated.sweep.csv"),
        "calibrate": json.loads((folder / "calibrate.out.json").read_text()),
    }
    ncu = folder / "ncu-tiny.out.json"
    result["ncu_tiny"] = json.loads(ncu.read_text()) if ncu.is_file() else None
    write_results("capture_h200", result, markdown(result), indent=1)
    return result


def _within(errors: dict[str, float], names: list[str]) -> int:
    return sum(abs(errors[n]) <= TARGET for n in names)


def markdown(result: dict[str, Any]) -> str:
    """The results file."""
    device = result["provenance"]["device_run"]
    lines = ["# Capture and read-only calibration on an NVIDIA H200", "",
             f"- command: `{result['provenance']['command']}`",
             f"- device run: host `{device['machine']}` (one NVIDIA H200 SXM of the device tool, read-only: no clock, "
             f"power-limit or persistence change), Python {device['python']}, finished {device['date_utc']}",
             f"- GPU (nvidia-smi): `{' | '.join(device['nvidia_smi'].strip().splitlines()[1:])}`",
             f"- report: `{result['provenance']['report_machine']}`, {result['provenance']['report_date_utc']}", "",
             "## Captured workloads: predicted vs measured joules per step (auto mode; target within 10%)", "",
             "| workload | kernels | measured J | shipped h200: J (error) | calibrated: J (error) | step ms "
             "unprofiled / profiled | capture overhead |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, r in result["energy_per_step"].items():
        c = result["captures"][label]
        lines.append(f"| {label} | {c['kernels']} | {r['measured_j']:.2f} | {r['shipped']['predicted_j']:.2f} "
                     f"({r['shipped']['error']:+.1%}) | {r['calibrated']['predicted_j']:.2f} "
                     f"({r['calibrated']['error']:+.1%}) | {c['step_time_s'] * 1e3:.1f} / "
                     f"{c['profiled_step_time_s'] * 1e3:.1f} | {c['overhead']:+.1%} |")
    lines += ["", "## Calibrated profile on the bundled H200 data (targets: each within 10%)", "",
              "| bundled workload | measured J | shipped: error | calibrated: error |", "| --- | ---: | ---: | ---: |"]
    for label, r in result["bundled_energy_per_step"].items():
        lines.append(f"| {label} | {r['measured_j']:.2f} | {r['shipped']['error']:+.1%} | "
                     f"{r['calibrated']['error']:+.1%} |")
    micro = result["microbenchmarks"]
    names = [n for n in micro["shipped"] if not n.startswith(("steady_", "idle"))]
    lines += ["", f"Microbenchmark power from utilisations (`data/sweeps/h200-default.sweep.csv`): within 10% "
              f"{_within(micro['shipped'], names)}/{len(names)} shipped, {_within(micro['calibrated'], names)}/"
              f"{len(names)} calibrated.", "", "| microbenchmark | shipped error | calibrated error |",
              "| --- | ---: | ---: |"]
    lines += [f"| {n} | {micro['shipped'][n]:+.1%} | {micro['calibrated'][n]:+.1%} |" for n in micro["shipped"]]
    new = result["new_microbenchmarks"]
    lines += ["", "The same on this run's own `kdvfs calibrate` measurements (in-sample for the calibrated profile, "
              "independent data for the shipped one):", "", "| measurement | shipped error | calibrated error |",
              "| --- | ---: | ---: |"]
    lines += [f"| {n} | {new['shipped'][n]:+.1%} | {new['calibrated'][n]:+.1%} |" for n in new["shipped"]]
    ncu = result["ncu_tiny"]
    if ncu:
        lines += ["", "## `kdvfs capture --ncu` (tiny GPT on the GPU)", "",
                  f"Nsight Compute counters on {ncu['kernels_with_counters']} of {ncu['kernels']} kernels "
                  f"({ncu['activities'] - ncu['kernels']} memsets have none: ncu replays kernels only)."]
    lines += _calibrate_lines(result["calibrate"]) + _misses(result)
    return "\n".join(lines) + "\n"


def _misses(result: dict[str, Any]) -> list[str]:
    """Every figure outside its 10% target, with the amount."""
    misses = [f"- {key}: {label} with the {name} profile: {r[name]['error']:+.1%}"
              for key in ("energy_per_step", "bundled_energy_per_step") for label, r in result[key].items()
              for name in ("shipped", "calibrated") if abs(r[name]["error"]) > TARGET]
    misses += [f"- {key}: {kernel} with the {name} profile: {error:+.1%}"
               for key in ("microbenchmarks", "new_microbenchmarks") for name, errors in result[key].items()
               for kernel, error in errors.items() if abs(error) > TARGET]
    return ["", "## Figures outside the 10% target", "", *(misses or ["- none"])]


def _calibrate_lines(calibrate: dict[str, Any]) -> list[str]:
    shipped = load_profile("h200").cost_model
    lines = ["", "## `kdvfs calibrate` read-only: measurements and fitted parameters", "",
             f"In-sample power error from utilisations: {calibrate['power_mape']:.1%}.", "",
             "| parameter | shipped h200 | calibrated | |", "| --- | ---: | ---: | --- |"]
    for name, entry in calibrate["cost_model"].items():
        marker = "fitted" if name in calibrate["fitted"] else "kept"
        lines.append(f"| {name} | {shipped[name].value:.4g} | {entry['value']:.4g} | {marker} |")
    lines += ["", "| measurement | us per call | W | SM MHz |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {m['kernel']} | {m['time_s'] * 1e6:.1f} | {m['power_w']:.1f} | {m['core_mhz']:.0f} |"
              for m in calibrate["measurements"]]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("run", "report"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--cpu-test", action="store_true", help="run: tiny models on the CPU with a fake NVML")
    args = parser.parse_args()
    if args.action == "run":
        run(args.folder, args.cpu_test)
    else:
        print(markdown(report(args.folder)))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
