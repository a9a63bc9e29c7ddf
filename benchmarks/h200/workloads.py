"""H200 joules per step at auto, predicted vs measured, on real workloads captured at several shapes.

    python -m benchmarks.h200.workloads run RESULTS_DIR [--only LABEL,...]   # on the GPU machine
    python -m benchmarks.h200.workloads report [RESULTS_DIR]                 # anywhere

``run`` captures each workload of ``WORKLOADS`` with ``kdvfs capture`` (read-only NVML), one fixed shape per
capture, each trace stamped with its step shape (``--cpu-test``: tiny versions on a CPU with the fake NVML).
``report`` predicts every captured trace (default: ``data/traces/h200/workloads``) and the bundled H200 steps
at auto with the shipped profile against the joules per step NVML measured, and writes
``benchmarks/results/workloads_h200.{json,md}``: the error per workload (target: within ``TARGET``) and the
split of the predicted energy. No parameter is fitted on these measurements. Method:
``docs/design/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.common.kdvfs_command import run_kdvfs
from benchmarks.common.provenance import host, nvidia_smi, utc_now
from benchmarks.reports.workloads import report

SFT = ["examples/hf_sft.py", "--steps", "400"]


def _sft(model: str, batch: int, seq: int, *extra: str) -> list[str]:
    return [*SFT, "--model", model, "--batch", str(batch), "--min-len", str(seq), "--max-len", str(seq), *extra]


WORKLOADS: dict[str, tuple[list[str], list[list[int]] | None]] = {
    # family-shape label: (script and arguments, the step shape they fix: model inputs by keyword name)
    **{f"llama-b{b}-s{s}": (_sft("llama", b, s), [[b, s]] * 3)
       for b, s in ((8, 128), (8, 256), (8, 512), (8, 768), (8, 1024), (4, 1024), (16, 256), (2, 512))},
    **{f"mixtral-b{b}-s{s}": (_sft("mixtral", b, s), [[b, s]] * 3)
       for b, s in ((8, 256), (8, 512), (8, 1024), (4, 768))},
    **{f"bert-b{b}-s{s}": (_sft("bert", b, s), [[b, s], [b, s], [b]])
       for b, s in ((32, 128), (32, 256), (32, 512), (16, 384))},
    "vit-b64": (["examples/hf_vit.py", "--batch", "64", "--steps", "400"], [[64], [64, 3, 224, 224]]),
    "gpt2s-compiled-b16": (["examples/gpt.py", "--size", "gpt2s", "--batch", "16", "--steps", "600", "--compile"],
                           None),
}
CPU_WORKLOADS: dict[str, tuple[list[str], list[list[int]] | None]] = {
    "llama-tiny-b2-s32": (_sft("llama", 2, 32, "--size", "tiny", "--device", "cpu"), [[2, 32]] * 3),
    "mixtral-tiny-b2-s48": (_sft("mixtral", 2, 48, "--size", "tiny", "--device", "cpu"), [[2, 48]] * 3),
}


def run(folder: Path, cpu_test: bool, only: list[str] | None) -> None:
    """Capture every workload (or ``only`` those) into ``folder``; the shapes go to ``shapes.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    workloads = CPU_WORKLOADS if cpu_test else WORKLOADS
    fake = ["--cpu-test-mode", "--nvml-module", "kdvfs.runtime.testing.nvml"] if cpu_test else []
    log = []
    for label, (script, _) in workloads.items():
        if only and label not in only:
            continue
        log.append(run_kdvfs(folder, label, ["capture", "--steps", "2", "--warmup", "4", "--energy-window-s",
                                          "0.5" if cpu_test else "4", "--workload", label, "-o",
                                          str(folder / f"{label}.trace.json.gz"), "--json", *fake, "--",
                                          sys.executable, *script]))
    (folder / "shapes.json").write_text(json.dumps({label: shape for label, (_, shape) in workloads.items()}))
    environment = {**host(), "date_utc": utc_now(), "log": log, "nvidia_smi": "" if cpu_test else nvidia_smi()}
    (folder / f"run-{int(time.time())}.json").write_text(json.dumps(environment, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("run", "report"))
    parser.add_argument("folder", type=Path, nargs="?", default=None)
    parser.add_argument("--cpu-test", action="store_true")
    parser.add_argument("--only", type=lambda text: text.split(","), default=None)
    args = parser.parse_args()
    if args.stage == "report":
        print(report(args.folder))
    elif args.folder is None:
        parser.error("run needs the RESULTS_DIR to capture into")
    else:
        run(args.folder, args.cpu_test, args.only)


if __name__ == "__main__":
    main()
