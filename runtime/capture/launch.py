"""``kdvfs capture``'s parent side: run the user's command under the capture bootstrap and collect the result.

The script runs unmodified in a child process of the user's Python (``python -m kdvfs.runtime.capture.boot``),
which writes the trace and a report into a private temporary folder; only when everything succeeded are
the trace (and the raw recording, ``--keep-profile``) copied atomically to where the user asked. A script
that fails passes its exit code through; nothing is written then.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from kdvfs.envs.common.files import read_text, write_text_atomic
from kdvfs.envs.trace.format import load_trace, save_trace
from kdvfs.envs.trace.trace import Trace
from kdvfs.runtime.capture import ncu_run
from kdvfs.runtime.capture.config import CaptureConfig
from kdvfs.runtime.capture.errors import CaptureError, ScriptExitError
from kdvfs.runtime.capture.recording import CaptureReport
from kdvfs.runtime.child import child_environment
from kdvfs.runtime.child import split_command as split_user_command


def split_command(command: Sequence[str]) -> tuple[str, list[str]]:
    """The interpreter and the target of the user's command (see :func:`kdvfs.runtime.child.split_command`)."""
    return split_user_command(command, "kdvfs capture")


def boot_argv(interpreter: str, config_path: Path, target: Sequence[str]) -> list[str]:
    """The child process command: the capture bootstrap around the user's target."""
    return [interpreter, "-m", "kdvfs.runtime.capture.boot", str(config_path), *target]


def _run_child(argv: Sequence[str], config: CaptureConfig, config_path: Path, stdout: int | None) -> dict[str, Any]:
    """Run one child process with ``config`` saved at ``config_path`` (its standard output to the file
    descriptor ``stdout``, default inherited); its report, or the matching error."""
    config.save(config_path)
    environment = child_environment(config.cpu_test_mode)
    code = subprocess.run(list(argv), env=environment, stdout=stdout, check=False).returncode
    report = Path(config.report_path or "")
    document = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else None
    if document is not None and document.get("status") == "ok":
        return dict(document.get("report") or {})
    if document is not None:
        raise CaptureError(str(document.get("message")))
    if code != 0:
        exit_code = code if code > 0 else 128 - code
        raise ScriptExitError(f"the script exited with code {exit_code} before the capture completed; nothing was "
                              "written", exit_code)
    raise CaptureError("the capture process ended without a report; nothing was written")


def _ncu_counters(ncu: str, interpreter: str, target: Sequence[str], child: CaptureConfig, folder: Path,
                  trace: Trace, stdout: int | None) -> tuple[Trace, int]:
    """Run the script again under ncu for the step after the warm-up; the trace with its counters."""
    config = replace(child, mark_only=True, measure_energy=False, report_path=str(folder / "ncu-report.json"))
    config_path, log = folder / "ncu-capture.json", folder / "ncu.csv"
    _run_child(ncu_run.ncu_argv(ncu, log, boot_argv(interpreter, config_path, target)), config, config_path, stdout)
    return ncu_run.enrich(trace, log)


def run_capture(command: Sequence[str], config: CaptureConfig, ncu: bool = False,
                script_stdout: int | None = None) -> CaptureReport:
    """Capture the user's ``command`` (``python train.py ARGS``) as described by ``config``.

    With ``ncu``, a second run under Nsight Compute adds counters to the trace's kernels. The script's
    standard output goes to the file descriptor ``script_stdout`` (default: this process's).
    Raises:
        CaptureError: the capture failed (nothing written).
        ScriptExitError: the script exited with a non-zero code (its ``exit_code``; nothing written).
    """
    interpreter, target = split_command(command)
    ncu_path = ncu_run.find_ncu() if ncu else None
    with tempfile.TemporaryDirectory(prefix="kdvfs-capture-") as name:
        folder = Path(name)
        child = replace(config, output=str(folder / "trace.json"), command=" ".join(command).removeprefix("-- "),
                        keep_profile=str(folder / "profile.json") if config.keep_profile else None,
                        report_path=str(folder / "report.json"))
        report = CaptureReport(**_run_child(boot_argv(interpreter, folder / "capture.json", target), child,
                                            folder / "capture.json", script_stdout))
        trace = load_trace(Path(child.output))
        if ncu_path is not None:
            trace, matched = _ncu_counters(ncu_path, interpreter, target, child, folder, trace, script_stdout)
            report = replace(report, kernels_with_counters=matched)
        if config.keep_profile:
            write_text_atomic(Path(config.keep_profile), read_text(folder / "profile.json"))
        save_trace(trace, Path(config.output))
    return replace(report, output=config.output)
