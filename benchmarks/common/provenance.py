"""What every benchmark results file records about the run that wrote it, and how the files are written.

The benchmarks run as modules from the repository root (``python -m benchmarks.ROOM.NAME``) and import this one
as ``benchmarks.common.provenance``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kdvfs.common.paths import REPO_ROOT
from kdvfs.common.run_record import git_revision, tracked_diff

RESULTS = REPO_ROOT / "benchmarks" / "results"
PROVENANCE_KEYS = ("figure", "command", "machine", "python", "date_utc", "git_revision")
CLAIMS = "docs/results.md"
NVIDIA_SMI_QUERY = "name,driver_version,clocks.sm,clocks.mem,power.draw,power.limit,persistence_mode,temperature.gpu"


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def python_version() -> str:
    """This interpreter's version, e.g. ``3.11.7``."""
    return sys.version.split()[0]


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else what ``platform`` knows, else ``cpu``."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                platform.processor() or "cpu")


def machine_description() -> str:
    """Host name, architecture, CPU model and core count: ``host (x86_64, AMD EPYC, 2 cores)``."""
    return f"{platform.node()} ({platform.machine()}, {cpu_model()}, {os.cpu_count()} cores)"


def benchmark_figure() -> str:
    """What the running benchmark measures: the first line of its script's docstring (``__main__``), with a
    pointer to the claim list; ``benchmark`` where the script has none."""
    doc = getattr(sys.modules.get("__main__"), "__doc__", None) or "benchmark"
    return f"{doc.strip().splitlines()[0].rstrip('.:')} (claim list: `{CLAIMS}`)"


def provenance(command: str, figure: str | None = None) -> dict[str, str]:
    """The provenance block of a results file: ``PROVENANCE_KEYS`` in that order for a run of ``command``
    measuring ``figure`` (default: :func:`benchmark_figure`), and, where the revision is ``+dirty``, ``git_diff``:
    the tracked files' ``git diff HEAD`` at the run (the code that ran, rebuilt from the revision and it)."""
    revision = git_revision()
    block = {"figure": figure or benchmark_figure(), "command": command, "machine": machine_description(),
             "python": python_version(), "date_utc": utc_now(), "git_revision": revision}
    return {**block, "git_diff": tracked_diff()} if revision.endswith("+dirty") else block


def provenance_lines(record: Mapping[str, Any]) -> list[str]:
    """The Markdown bullet list of the provenance keys of ``record`` (a provenance block or a whole document); the
    figure as text, the rest as code; a key the record lacks (a file written before it existed) is left out; a
    ``git_diff`` is named, not printed (it is in the JSON file)."""
    lines = [f"- {key}: {record[key]}" if key == "figure" else f"- {key}: `{record[key]}`"
             for key in PROVENANCE_KEYS if key in record]
    if "git_diff" in record:
        lines.append(f"- git_diff: the tracked changes at the run ({len(str(record['git_diff']).splitlines())} "
                     "lines of `git diff HEAD`), in the JSON file's `git_diff`")
    return lines


def host(module: str | None = None) -> dict[str, str]:
    """The bare host record of a run on the GPU machine: its host name and Python version, and with ``module`` the
    command that ran it (``python -m MODULE`` and this process's arguments)."""
    record = {"machine": platform.node(), "python": python_version()}
    if module is not None:
        record["command"] = " ".join(["python", "-m", module, *sys.argv[1:]])
    return record


def nvidia_smi(header: bool = True) -> str:
    """``nvidia-smi``'s CSV of the GPUs' name, driver, clocks, power, persistence and temperature.

    With ``header`` the CSV as printed (a header line first); without, only the GPU lines, stripped."""
    csv = "csv" if header else "csv,noheader"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={NVIDIA_SMI_QUERY}", f"--format={csv}"],
                             capture_output=True, text=True, check=False).stdout
    except OSError:
        return "nvidia-smi not available"
    return out if header else out.strip()


def local_profile(cpu_test: bool = False) -> str:
    """The shipped GPU profile (name) of this machine's first GPU, by its NVML name as ``nvidia-smi`` prints it;
    ``"h200"`` in a CPU test (the fake NVML is a recorded H200). Raises
    :class:`~kdvfs.common.errors.UnknownGpuError` when no shipped profile lists the GPU."""
    if cpu_test:
        return "h200"
    from kdvfs.envs.gpu.profiles import profile_for_nvml_name

    name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True, check=True).stdout.splitlines()[0].strip()
    return profile_for_nvml_name(name).name


def write_results(stem: str, result: Mapping[str, Any], markdown: str | None = None, *, indent: int = 2,
                  folder: Path = RESULTS) -> None:
    """Write ``folder/stem.json`` (``result`` as JSON with ``indent``) and, when given, ``folder/stem.md``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.json").write_text(json.dumps(result, indent=indent) + "\n")
    if markdown is not None:
        (folder / f"{stem}.md").write_text(markdown)
