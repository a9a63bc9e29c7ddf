"""The clock controller in dry-run mode on a real GPU: its overhead on step time, its timing error and its
online decisions' time.

    python -m benchmarks.h200.controller plans                # anywhere: the latency-optimal plans it applies
    python -m benchmarks.h200.controller run RESULTS_DIR [--policy P]   # on the GPU machine: dry runs only
    python -m benchmarks.h200.controller report RESULTS_DIR [--name NAME]   # anywhere: benchmarks/results/NAME.*

``run`` never changes a clock: every controller is a dry run whose NVML binding is
``benchmarks.common.nvml_guard`` (any Set/Reset/Clear call is refused and counted). It runs ``kdvfs run
--dry-run`` end to end (unless ``--no-end-to-end``), then per workload one ``child`` process alternating
windows with and without the controller (ABBA; ``--variant``/``--within``: other controller options, as
separate processes or as arms of one), optionally profiling controlled steps. ``report`` computes the
overhead (step time with over without), the timing error of planned switch instants and kernel starts against
the profile, and the online decisions' time. ``--cpu-test``: all of it on a CPU with the fake NVML (figures
mean nothing). Options and method: ``docs/design/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common.provenance import host, nvidia_smi, utc_now
from benchmarks.reports.controller_arms import arm_order
from benchmarks.reports.controller_windows import ORDER, PLANS, SETTLE_STEPS, WARMUP_STEPS, parse_options, plan_path
from kdvfs.common.paths import REPO_ROOT

CLI = "import sys; from kdvfs.runtime.cli import main; sys.exit(main(sys.argv[1:]))"
GUARD = "benchmarks.common.nvml_guard"
WORKLOADS: dict[str, dict[str, Any]] = {
    "gpt3xl-b4": {"trace": "h200/capture-gpt3xl-b4", "window_steps": 30, "profile_steps": 10,
                  "script": ["examples/gpt.py", "--size", "gpt3xl", "--batch", "4"]},
    "gpt2s-b16": {"trace": "h200/capture-gpt2s-b16", "window_steps": 80, "profile_steps": 0,
                  "script": ["examples/gpt.py", "--size", "gpt2s", "--batch", "16"]},
}
HF_WORKLOADS: dict[str, dict[str, Any]] = {
    "hf-gpt2s-b8": {"trace": "", "window_steps": 40, "profile_steps": 10,
                    "script": ["examples/hf_trainer.py", "--size", "gpt2s", "--batch", "8"]},
    "hf-gpt2s-b32": {"trace": "", "window_steps": 40, "profile_steps": 10,
                     "script": ["examples/hf_trainer.py", "--size", "gpt2s", "--batch", "32"]},
}
"""Hugging Face Trainer workloads (``--hf``; needs transformers): captured at the start of the run. GPT-2 small at
batch 8 and at batch 32: the controller's cost is about the same time a step at both, a smaller share of the
longer step."""
CPU_WORKLOADS: dict[str, dict[str, Any]] = {
    "gpt-tiny": {"trace": "", "window_steps": 8, "profile_steps": 3,
                 "script": ["examples/gpt.py", "--size", "tiny", "--device", "cpu"]},
}
CLI_STEPS = 150


def make_plan(trace: str, output: Path) -> None:
    """The latency-optimal plan at a 1% budget with the profile's switching latency (`kdvfs plan`)."""
    _kdvfs(["plan", "--trace", trace, "--gpu", "h200", "--method", "latency-optimal", "--budget", "0.01",
            "-o", str(output)])


def _kdvfs(args: list[str], env: dict[str, str] | None = None, stdout: Any = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=REPO_ROOT, text=True, env=env, stdout=stdout,
                          check=True)


class Done(BaseException):
    """Ends the training script from the optimizer hook once the measurements are taken."""


def _sync() -> None:
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Harness:
    """Drives one ``child`` run from the optimizer-step hook (a generator resumed once per step)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.windows: list[dict[str, Any]] = []
        self._steps = self._schedule()

    def on_step(self) -> None:
        next(self._steps)

    def _controller(self, log: str | None, options: list[str]) -> Any:
        from kdvfs.runtime.controller import Controller

        return Controller(self.args.plan, self.args.trace, dry_run=True, nvml_module=self.args.nvml_module, log=log,
                          cpu_test_mode=self.args.cpu_test,
                          match_tolerance=0.99 if self.args.cpu_test else 0.1, **parse_options(options))

    def _window(self, on: bool, steps: int, options: list[str]) -> Iterator[None]:
        controller = self._controller(str(self.args.out / "window.jsonl"), options) if on else None
        if controller is not None:
            controller.__enter__()
        _sync()
        hooks_s = [time.perf_counter()]
        for _ in range(steps):
            if controller is not None:
                controller.step()
            yield
            hooks_s.append(time.perf_counter())
        _sync()
        elapsed_s = time.perf_counter() - hooks_s[0]
        if controller is not None:
            controller.close()
        self.windows.append({"controller": on, "arm": ",".join(options), "steps": steps, "elapsed_s": elapsed_s,
                             "step_s": [b - a for a, b in itertools.pairwise(hooks_s)],
                             "summary": None if controller is None or controller.summary is None
                             else controller.summary.to_json()})

    def _schedule(self) -> Iterator[None]:
        for _ in range(WARMUP_STEPS):
            yield
        arms = arm_order([self.args.option, *(arm.split(",") for arm in self.args.arm)], self.args.repeat)
        for options in arms:
            for on in ORDER:
                yield from self._window(on, self.args.window_steps, options)
        if self.args.profile_steps:
            yield from self._profiled()
        raise Done

    def _profiled(self) -> Iterator[None]:
        import torch
        from torch.profiler import ProfilerActivity, profile

        controller = self._controller(str(self.args.out / f"{self.args.label}.log.jsonl"), self.args.option)
        controller.__enter__()
        for _ in range(SETTLE_STEPS):
            controller.step()
            yield
        on_gpu = torch.cuda.is_initialized()
        profiler = profile(activities=[ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU])
        profiler.start()
        for _ in range(self.args.profile_steps + 1):
            controller.step()
            yield
        _sync()
        profiler.stop()
        profiler.export_chrome_trace(str(self.args.out / f"{self.args.label}.profile.json.gz"))
        controller.close()


def child(args: argparse.Namespace) -> int:
    """Train the script with the harness's hook; write RESULTS_DIR/LABEL.json."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from kdvfs.runtime.child import run_target
    from kdvfs.runtime.device.nvml_device import import_nvml

    harness = Harness(args)
    register_optimizer_step_post_hook(lambda optimizer, a, k: harness.on_step())
    with contextlib.suppress(Done):
        run_target(args.script)
    nvml = import_nvml(args.nvml_module)
    log = args.out / f"{args.label}.log.jsonl"
    document = {"label": args.label, "plan": os.path.relpath(args.plan, REPO_ROOT), "trace": args.trace,
                "windows": harness.windows,
                "profile": f"{args.label}.profile.json.gz" if args.profile_steps else None,
                "log": [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else [],
                "nvml": nvml.record() if hasattr(nvml, "record") else None}
    (args.out / f"{args.label}.json").write_text(json.dumps(document))
    log.unlink(missing_ok=True)
    (args.out / "window.jsonl").unlink(missing_ok=True)
    return 0


def _cpu_setup(folder: Path) -> dict[str, dict[str, Any]]:
    """CPU test: capture the tiny model's step on the CPU and plan it."""
    trace = folder / "gpt-tiny.trace.json"
    _kdvfs(["capture", "--cpu-test-mode", "--nvml-module", "kdvfs.runtime.testing.nvml", "--energy-window-s", "0.5",
            "-o", str(trace), "--", "python", *CPU_WORKLOADS["gpt-tiny"]["script"], "--steps", "400"])
    make_plan(str(trace), plan_path("gpt-tiny", folder))
    return {"gpt-tiny": {**CPU_WORKLOADS["gpt-tiny"], "trace": str(trace)}}


def _cli_run(folder: Path, workload: dict[str, Any], source: Path, fake: list[str]) -> dict[str, Any]:
    """``kdvfs run --dry-run`` end to end; its summary and the NVML calls it made."""
    record = folder / "cli-nvml.json"
    env = {**os.environ, "KDVFS_NVML_RECORD": str(record)}
    nvml = fake or ["--nvml-module", GUARD]
    start_s = time.perf_counter()
    done = _kdvfs(["run", "--dry-run", "--policy", str(source), "--trace", workload["trace"],
                   "--log", str(folder / "cli.log.jsonl"), "--json", *nvml, "--", "python3", *workload["script"],
                   "--steps", str(CLI_STEPS)], env=env, stdout=subprocess.PIPE)
    nvml_calls = json.loads(record.read_text()) if record.is_file() else None
    requests = sum(1 for line in (folder / "cli.log.jsonl").read_text().splitlines() if '"request"' in line)
    (folder / "cli.log.jsonl").unlink()
    return {"command": f"kdvfs run --dry-run --policy {source.name} --trace {workload['trace']} "
                       f"--nvml-module {GUARD} -- python3 {' '.join(workload['script'])} --steps {CLI_STEPS}",
            "wall_s": time.perf_counter() - start_s, "summary": json.loads(done.stdout), "nvml": nvml_calls,
            "logged_requests": requests}


def _capture(folder: Path, label: str, workload: dict[str, Any]) -> dict[str, Any]:
    """Capture ``workload``'s step into ``folder`` (``kdvfs capture`` through the guard); the workload with it."""
    trace = folder / f"{label}.trace.json"
    _kdvfs(["capture", "--nvml-module", GUARD, "-o", str(trace), "--", "python3", *workload["script"],
            "--steps", "300"])
    return {**workload, "trace": str(trace)}


def run(folder: Path, cpu_test: bool, policy: Path | None, hf: bool = False, only: list[str] | None = None,
        variants: list[str] | None = None, repeat: int = 1, within: bool = False, end_to_end: bool = True) -> None:
    """All device-side measurements into ``folder``; ``policy`` replaces the plans of every workload; ``hf``
    adds the Hugging Face Trainer workloads (captured here first; they need ``policy``); ``only`` keeps those
    workloads; each of ``variants`` (``LABEL:NAME=VALUE,...``) runs workload LABEL again with those controller
    options, as ``LABEL[NAME=VALUE,...]`` (its overhead, no profile): in a child of its own, or with ``within``
    as an arm of LABEL's child (its windows' blocks interleaved with the others', ``arm_order``);
    ``end_to_end``: first run ``kdvfs run --dry-run`` of the first workload (1.)."""
    known = {**(CPU_WORKLOADS if cpu_test else WORKLOADS), **(HF_WORKLOADS if hf else {})}
    kept = [label for label in known if not only or label in {o.split("[")[0] for o in only}]
    for variant in variants or []:
        if variant.partition(":")[0] not in kept:
            raise SystemExit(f"--variant {variant!r}: no workload {variant.partition(':')[0]!r} "
                             f"(kept: {', '.join(kept)})")
    folder.mkdir(parents=True, exist_ok=True)
    workloads, plans = (_cpu_setup(folder), folder) if cpu_test else (dict(WORKLOADS), PLANS)
    if hf:
        workloads.update({label: _capture(folder, label, w) for label, w in HF_WORKLOADS.items()
                          if label in kept})
    for variant in variants or []:
        label, _, options = variant.partition(":")
        if within:
            workloads[label] = {**workloads[label], "arms": [*workloads[label].get("arms", []), options]}
        else:
            workloads[f"{label}[{options}]"] = {**workloads[label], "profile_steps": 0,
                                                "options": options.split(",")}
    workloads = {label: w for label, w in workloads.items() if not only or label in only or label.split("[")[0] in only}
    sources = {label: policy.resolve() if policy else plan_path(label.split("[")[0], plans) for label in workloads}
    fake = ["--cpu-test-mode", "--nvml-module", "kdvfs.runtime.testing.nvml"] if cpu_test else []
    first = next(iter(workloads))
    log: dict[str, Any] = {**host("benchmarks.h200.controller"), "started_utc": utc_now(),
                           "nvidia_smi_before": nvidia_smi(header=False),
                           "cli": _cli_run(folder, workloads[first], sources[first], fake) if end_to_end else None}
    for label, workload in workloads.items():
        start_s = time.perf_counter()
        subprocess.run([sys.executable, "-m", "benchmarks.h200.controller", "child", "--label", label,
                        "--plan", str(sources[label]), "--trace", workload["trace"],
                        "--window-steps", str(workload["window_steps"]), "--profile-steps",
                        str(workload["profile_steps"]), "--nvml-module", fake[-1] if fake else GUARD,
                        *(["--cpu-test"] if cpu_test else []), "--repeat", str(repeat),
                        *[f"--option={option}" for option in workload.get("options", [])],
                        *[f"--arm={arm}" for arm in workload.get("arms", [])],
                        str(folder), "--", *workload["script"], "--steps", "100000"],
                       cwd=REPO_ROOT, check=True, env=_with_root_on_path())
        log[f"{label}_wall_s"] = time.perf_counter() - start_s
        log["children"] = [*log.get("children", []), label]
        (folder / "run.json").write_text(json.dumps(log, indent=1))  # a run cut short keeps what it did
    log["nvidia_smi_after"], log["finished_utc"] = nvidia_smi(header=False), utc_now()
    (folder / "run.json").write_text(json.dumps(log, indent=1))


def _with_root_on_path() -> dict[str, str]:
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("plans")
    for name in ("run", "report"):
        command = sub.add_parser(name)
        command.add_argument("folder", type=Path)
        command.add_argument("--cpu-test", action="store_true")
    sub.choices["run"].add_argument("--policy", type=Path, help="a plan or frozen policy for every workload "
                                    "(default: the latency-optimal plans in benchmarks/results)")
    sub.choices["run"].add_argument("--hf", action="store_true", help="add the Hugging Face Trainer workloads")
    sub.choices["run"].add_argument("--only", nargs="+", metavar="LABEL", help="only these workloads")
    sub.choices["run"].add_argument("--variant", nargs="+", metavar="LABEL:NAME=VALUE,...",
                                    help="run LABEL again with these controller options (e.g. online=false)")
    sub.choices["run"].add_argument("--within", action="store_true", help="run the variants as arms of their "
                                    "workload's own process, window blocks interleaved (no process-to-process "
                                    "spread between them)")
    sub.choices["run"].add_argument("--repeat", type=int, default=1, help=f"run the {len(ORDER)} windows "
                                    "(ABBA...) this many times per workload (more pairs: a narrower interval)")
    sub.choices["run"].add_argument("--no-end-to-end", action="store_true", help="skip the end-to-end "
                                    "`kdvfs run --dry-run` (1.): only the workloads' processes")
    sub.choices["report"].add_argument("--name", default="controller_h200", help="results file stem "
                                       "(controller_online_h200: the default with the shipped policy)")
    kid = sub.add_parser("child")
    kid.add_argument("out", type=Path)
    for option in ("--label", "--plan", "--trace", "--nvml-module"):
        kid.add_argument(option, required=True)
    kid.add_argument("--window-steps", type=int, required=True)
    kid.add_argument("--profile-steps", type=int, required=True)
    kid.add_argument("--cpu-test", action="store_true")
    kid.add_argument("--repeat", type=int, default=1)
    kid.add_argument("--option", action="append", default=[], help="NAME=true|false|NUMBER, a controller option")
    kid.add_argument("--arm", action="append", default=[], help="NAME=VALUE,...: another arm's options")
    kid.add_argument("script", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.what == "plans":
        for label, workload in WORKLOADS.items():
            make_plan(workload["trace"], plan_path(label))
    elif args.what == "run":
        run(args.folder, args.cpu_test, args.policy, args.hf, args.only, args.variant, args.repeat, args.within,
            not args.no_end_to_end)
    elif args.what == "child":
        args.script = args.script[1:] if args.script[:1] == ["--"] else args.script
        return child(args)
    else:
        from benchmarks.reports.controller import report

        report(args.folder, args.cpu_test, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
