"""Run one kdvfs command from a benchmark's ``run`` stage and keep its record (the H200 benchmarks share it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kdvfs.common.paths import REPO_ROOT

CLI = "import sys; from kdvfs.runtime.cli import main; sys.exit(main(sys.argv[1:]))"
"""``python -c CLI ARGS`` is ``kdvfs ARGS`` where kdvfs is importable but not installed (the device machine)."""


def run_kdvfs(folder: Path, label: str, args: list[str], env: dict[str, str] | None = None,
              tail_chars: int = 1500) -> dict[str, Any]:
    """Run ``kdvfs ARGS`` in the repository (with ``env`` added to the environment); its stdout goes to
    ``folder/LABEL.out.json``; returns (and prints) its command, exit code, wall time and stderr's tail."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          env={**os.environ, **(env or {})})
    record = {"label": label, "command": "kdvfs " + " ".join(args), "exit_code": done.returncode,
              "wall_s": time.perf_counter() - start, "stderr_tail": done.stderr[-3000:]}
    (folder / f"{label}.out.json").write_text(done.stdout or "{}")
    print(json.dumps({k: v for k, v in record.items() if k != "stderr_tail"}), done.stderr[-tail_chars:], flush=True)
    return record


def run_kdvfs_through(folder: Path, label: str, args: list[str], nvml: str) -> dict[str, Any]:
    """:func:`run_kdvfs` of ``kdvfs ARGS`` (its options, ``--``, the script) with NVML through the module ``nvml``
    (``benchmarks.common.nvml_guard`` on a GPU), recording its NVML calls in ``folder/LABEL.nvml.json``."""
    split = args.index("--")
    return run_kdvfs(folder, label, [*args[:split], "--nvml-module", nvml, *args[split:]],
                     {"KDVFS_NVML_RECORD": str(folder / f"{label}.nvml.json")}, tail_chars=1200)
