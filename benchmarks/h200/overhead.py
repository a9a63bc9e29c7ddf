"""kdvfs's whole cost on a real GPU: the same training script with and without `kdvfs run --dry-run`.

    python -m benchmarks.h200.overhead run DIR [--pairs 3] [--only LABEL ...] [--own-process] [--policy P]  # on the GPU
    python -m benchmarks.h200.overhead report DIR [--name overhead_h200]         # anywhere

``run`` never changes a clock (NVML through ``benchmarks.common.nvml_guard``). It probes the NVML reads'
cost, then per workload runs ``--pairs`` ABBA pairs of processes: the script under
``benchmarks/h200/step_clock.py``, alone or under ``kdvfs run --dry-run --in-process`` with the shipped policy (or
``--policy``'s file, say a residual policy deciding online)
(``--own-process``: a third process per pair, under ``kdvfs run --dry-run``, whose controller runs in a process of
its own, the order reversed every other pair; the report gives it as the workload ``LABEL (own process)`` against
the same pairs' processes without kdvfs). ``report``
gives per workload the whole-run overhead (mean step time after ``WARMUP_STEPS``, with over without, 95% t
interval), the dry run's own A/B slowdown (truth 0), the controller's host cost, the online decisions' time
and the requests' timeliness, each against ``TARGETS``. ``--cpu-test``: all of it on a CPU with the fake NVML
(figures mean nothing). Method: ``docs/design/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common.kdvfs_command import CLI
from benchmarks.common.provenance import host, local_profile, nvidia_smi, utc_now
from kdvfs.common.paths import REPO_ROOT

GUARD = "benchmarks.common.nvml_guard"
WINDOW_KEYS = ("arm", "pair", "steps", "controlled_steps", "host_pace_s")
"""What a process's record keeps of each A/B window of its log (the report's ``host_pace_arm``)."""
POLICY = "policies/{profile}.kdvfs-policy.npz"
"""The shipped policy of the local GPU's profile (the H200's where the workloads' recorded traces come from)."""
WORKLOADS: dict[str, dict[str, Any]] = {
    "hf-gpt2s-b8": {"script": ["examples/hf_trainer.py", "--size", "gpt2s", "--batch", "8"], "steps": 360,
                    "trace": None},
    "hf-gpt2s-b32": {"script": ["examples/hf_trainer.py", "--size", "gpt2s", "--batch", "32"], "steps": 140,
                     "trace": None},
    "gpt3xl-b4": {"script": ["examples/gpt.py", "--size", "gpt3xl", "--batch", "4"], "steps": 170,
                  "trace": "h200/capture-gpt3xl-b4"},
}
"""Each workload's script, steps per process and trace (None: captured in the run; a recorded trace, named by its
GPU's profile, is captured anew on another GPU)."""
CPU_WORKLOADS: dict[str, dict[str, Any]] = {
    "gpt-tiny": {"script": ["examples/gpt.py", "--size", "tiny", "--device", "cpu"], "steps": 2000, "trace": None,
                 "capture_steps": 3000},
}
CAPTURE_STEPS = 200
PROBE_S = 1.0
"""How long each NVML read is probed (s)."""
POWER_PROBE_S = 3.0
"""How long the power fields are read beside the energy counter, under a load that changes (s)."""
LOAD_PHASE_S = 0.25
"""The probe's matrix-multiply load on the GPU runs this long, then pauses as long (s)."""


def _env(cpu_test: bool = False) -> dict[str, str]:
    """The processes' environment: this checkout first on PYTHONPATH; in a CPU test one intra-op thread, as
    ``kdvfs run --cpu-test-mode`` gives its child, in both arms."""
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1",
            **({"OMP_NUM_THREADS": "1"} if cpu_test else {})}


def _kdvfs(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=REPO_ROOT, text=True, env=_env(), **kwargs)


def probe(nvml_module: str) -> dict[str, Any]:
    """The NVML reads' cost and the energy counter's update period (see the module docstring, 1.)."""
    import importlib

    nvml = importlib.import_module(nvml_module)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    result: dict[str, Any] = {}
    reads: list[tuple[str, Any, float]] = [
        ("energy", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle), 0.0),
        ("power", lambda: nvml.nvmlDeviceGetPowerUsage(handle), 1e-3)]
    if hasattr(nvml, "nvmlDeviceGetFieldValues"):  # the same counter through the field-value call (mJ): its cost
        energy_field = nvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
        reads.append(("energy_field", lambda: field_value(nvml, handle, energy_field), 0.0))
    for name, read, gap_s in reads:
        walls, cpus, changes, given, last = [], [], [], 0, read()
        end_s = time.perf_counter() + PROBE_S
        while time.perf_counter() < end_s:
            wall, cpu = time.perf_counter(), time.thread_time()
            value = read()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.thread_time() - cpu)
            if value != last:
                changes.append(wall)
            given += value is not None
            last = value
            time.sleep(gap_s)
        gaps = [b - a for a, b in itertools.pairwise(changes)]
        result[name] = {"reads": len(walls), "given": given, "read_wall_ms": 1e3 * statistics.median(walls),
                        "read_cpu_ms": 1e3 * statistics.median(cpus),
                        "update_period_ms": 1e3 * statistics.median(gaps) if gaps else None}
    result["gil"] = _gil_probe(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
    try:  # a probe of what a later design may use: its failure must not cost the run
        result["power_beside_energy"] = power_beside_energy(nvml, handle)
    except Exception as error:  # recorded in the results
        result["power_beside_energy"] = {"error": repr(error)}
    nvml.nvmlShutdown()
    return result


def _field_w(nvml: Any, handle: Any, field: int) -> float | None:
    """An NVML power field in W (None: the driver does not give it)."""
    value = field_value(nvml, handle, field)
    return None if value is None else value / 1e3


def field_value(nvml: Any, handle: Any, field: int) -> float | None:
    """An NVML field value in the driver's unit (mW, mJ; None: the driver does not give it)."""
    try:
        value = nvml.nvmlDeviceGetFieldValues(handle, [field])[0]
    except nvml.NVMLError:
        return None
    if value.nvmlReturn != nvml.NVML_SUCCESS:
        return None
    kinds = {nvml.NVML_VALUE_TYPE_DOUBLE: "dVal", nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
             nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
             nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal"}
    return float(getattr(value.value, kinds[value.valueType]))


def power_beside_energy(nvml: Any, handle: Any) -> dict[str, Any]:
    """For ``POWER_PROBE_S``, the energy counter read back to back, each read followed by the power fields (the
    power usage, and the instantaneous and averaged fields where the driver has them), while a matrix-multiply
    load switches on and off every ``LOAD_PHASE_S``: whether a power read (microseconds) tells what an energy read
    (milliseconds) does, the mean power of the counter's last update period (report: ``power_vs_energy``).
    Rows: the energy read's start and end (host s), the counter (J), then each power field (W; None: not given)."""
    import torch

    stop = threading.Event()

    def load() -> None:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        while not stop.is_set():
            end_s = time.perf_counter() + LOAD_PHASE_S
            while time.perf_counter() < end_s:
                torch.mm(a, a)
                torch.cuda.synchronize()
            stop.wait(LOAD_PHASE_S)

    fields = {"usage": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
              "instant": lambda: _field_w(nvml, handle, nvml.NVML_FI_DEV_POWER_INSTANT),
              "average": lambda: _field_w(nvml, handle, nvml.NVML_FI_DEV_POWER_AVERAGE)}
    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    rows: list[list[Any]] = []
    end_s = time.perf_counter() + POWER_PROBE_S
    while time.perf_counter() < end_s:
        before_s = time.perf_counter()
        energy_j = nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3
        rows.append([before_s, time.perf_counter(), energy_j, *(read() for read in fields.values())])
    stop.set()
    loader.join()
    return {"fields": list(fields), "load_phase_s": LOAD_PHASE_S, "rows": rows}


def _gil_probe(read: Any, seconds: float = 1.0) -> dict[str, float]:
    """Iterations of a pure-Python loop per second alone and while another thread reads back to back: their
    ratio near 1 says a read does not hold the interpreter lock."""
    def loop() -> float:
        count, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            count += 1
        return count / seconds

    alone = loop()
    stop = threading.Event()
    reader = threading.Thread(target=lambda: [read() for _ in iter(stop.is_set, True)], daemon=True)
    reader.start()
    beside = loop()
    stop.set()
    reader.join()
    return {"loop_per_s_alone": alone, "loop_per_s_beside_reads": beside, "ratio": beside / alone}


def _capture(folder: Path, label: str, workload: dict[str, Any], fake: list[str]) -> str:
    trace = folder / f"{label}.trace.json"
    _kdvfs(["capture", *(fake or ["--nvml-module", GUARD]), "--energy-window-s", "2", "-o", str(trace), "--",
            sys.executable, *workload["script"], "--steps", str(workload.get("capture_steps", CAPTURE_STEPS))],
           check=True)
    return str(trace)


def _process(folder: Path, label: str, workload: dict[str, Any], pair: int, with_kdvfs: bool,
             fake: list[str], policy: str, own_process: bool = False) -> dict[str, Any]:
    """One process of a pair: the script under ``benchmarks/h200/step_clock.py``, under ``kdvfs run --dry-run``
    (``--in-process`` unless ``own_process``) or not."""
    name = f"{label}.{pair}.{('with-own' if own_process else 'with') if with_kdvfs else 'without'}"
    clock = folder / f"{name}.steps.json"
    target = [sys.executable, "benchmarks/h200/step_clock.py", str(clock), *workload["script"], "--steps",
              str(workload["steps"])]
    start_s = time.perf_counter()
    if with_kdvfs:
        log, record = folder / f"{name}.log.jsonl", folder / f"{name}.nvml.json"
        done = subprocess.run([sys.executable, "-c", CLI, "run", "--dry-run", "--policy", policy, "--trace",
                               workload["trace"], "--log", str(log), "--json", *(fake or ["--nvml-module", GUARD]),
                               *([] if own_process else ["--in-process"]), "--", *target], cwd=REPO_ROOT,
                              text=True, stdout=subprocess.PIPE, env={**_env(), "KDVFS_NVML_RECORD": str(record)},
                              check=False)
        records = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
        extra = {"exit_code": done.returncode, "summary": json.loads(done.stdout) if done.stdout.strip() else None,
                 "pairs_slowdown_pct": [r["slowdown_pct"] for r in records if r["event"] == "pair"],
                 "windows": [{key: r.get(key) for key in WINDOW_KEYS} for r in records if r["event"] == "window"],
                 "nvml": json.loads(record.read_text()) if record.is_file() else None}
        log.unlink(missing_ok=True)
    else:
        extra = {"exit_code": subprocess.run(target, cwd=REPO_ROOT, text=True, env=_env(bool(fake)),
                                             check=False).returncode}
    steps = json.loads(clock.read_text()) if clock.is_file() else {"step_s": [], "cpu_s": []}
    return {"label": label, "pair": pair, "with": with_kdvfs, "own_process": own_process,
            "wall_s": time.perf_counter() - start_s, **steps, **extra}


def run(folder: Path, pairs: int, only: list[str] | None, cpu_test: bool, own_process: bool = False,
        policy: str | None = None) -> None:
    """Every device-side measurement into ``folder/run.json`` (written after each process); ``own_process``: a
    third process per pair, the controller in a process of its own; ``policy``: the policy or plan file the
    controller runs (None: the local GPU's shipped policy)."""
    folder.mkdir(parents=True, exist_ok=True)
    fake = ["--cpu-test-mode", "--nvml-module", "kdvfs.runtime.testing.nvml"] if cpu_test else []
    workloads = {label: dict(w) for label, w in (CPU_WORKLOADS if cpu_test else WORKLOADS).items()
                 if not only or label in only}
    log: dict[str, Any] = {**host("benchmarks.h200.overhead"),
                           "started_utc": utc_now(), "nvidia_smi_before": nvidia_smi(header=False),
                           "probe": None if cpu_test else probe(GUARD), "own_process": own_process, "workloads": {},
                           "processes": []}
    profile = log["profile"] = local_profile(cpu_test)
    policy = log["policy"] = policy or POLICY.format(profile=profile)
    for label, workload in workloads.items():
        if workload["trace"] is None or not workload["trace"].startswith(f"{profile}/"):
            workload["trace"] = _capture(folder, label, workload, fake)
        log["workloads"][label] = workload
        arms = [(False, False), (True, False), *([(True, True)] if own_process else [])]
        for pair in range(pairs):
            for with_kdvfs, own in (arms if pair % 2 == 0 else arms[::-1]):  # ABBA (ABC CBA)
                log["processes"].append(_process(folder, label, workload, pair, with_kdvfs, fake, policy, own))
                (folder / "run.json").write_text(json.dumps(log))
    log["nvidia_smi_after"], log["finished_utc"] = nvidia_smi(header=False), utc_now()
    (folder / "run.json").write_text(json.dumps(log))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("run", "report"):
        command = sub.add_parser(name)
        command.add_argument("folder", type=Path)
        command.add_argument("--cpu-test", action="store_true")
    sub.choices["run"].add_argument("--pairs", type=int, default=3, help="ABBA process pairs per workload")
    sub.choices["run"].add_argument("--only", nargs="+", metavar="LABEL", help="only these workloads")
    sub.choices["run"].add_argument("--own-process", action="store_true",
                                    help="a third process per pair: the controller in a process of its own "
                                         "(kdvfs run's default)")
    sub.choices["run"].add_argument("--policy", help="policy or plan file the controller runs (default: the local "
                                    "GPU's shipped policy)")
    sub.choices["report"].add_argument("--name", default="overhead_h200", help="results file stem")
    args = parser.parse_args(argv)
    if args.what == "run":
        run(args.folder, args.pairs, args.only, args.cpu_test, args.own_process, args.policy)
    else:
        from benchmarks.reports.overhead import report

        report(args.folder, args.cpu_test, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
