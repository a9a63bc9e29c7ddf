"""``kdvfs capture``'s parent side: run the user's command under the capture bootstrap and collect the result.

The script runs unmodified in a child process of the user's Python (``python -m kdvfs.runtime.capture.capture_boot``;
under torchrun, each worker: ``torchrun OPTIONS -m kdvfs.runtime.capture.capture_boot ...``), which writes the
trace and a report into a private temporary folder; only when everything succeeded are
the trace (and the raw recording, ``--keep-profile``) copied atomically to where the user asked. A script
that fails passes its exit code through; nothing is written then.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from kdvfs.common.files import read_text, write_text_atomic
from kdvfs.envs.trace.format import load_trace, save_trace
from kdvfs.envs.trace.trace import Trace
from kdvfs.envs.trace.trace_set import shape_path, sibling_paths
from kdvfs.runtime.capture import ncu_run
from kdvfs.runtime.capture.capture_config import CaptureConfig
from kdvfs.runtime.capture.capture_errors import CaptureError, ScriptExitError
from kdvfs.runtime.capture.recording import CaptureReport
from kdvfs.runtime.child import UserCommand, child_environment
from kdvfs.runtime.child import split_command as split_user_command
from kdvfs.runtime.job import rank_documents, rank_path

BOOT = "kdvfs.runtime.capture.capture_boot"


def split_command(command: Sequence[str]) -> UserCommand:
    """The launcher and the target of the user's command (see :func:`kdvfs.runtime.child.split_command`)."""
    return split_user_command(command, "kdvfs capture")


def _run_child(argv: Sequence[str], config: CaptureConfig, config_path: Path, stdout: int | None
               ) -> list[dict[str, Any]]:
    """Run the training process(es) with ``config`` saved at ``config_path`` (standard output to the file
    descriptor ``stdout``, default inherited); each rank's report, or the matching error."""
    config.save(config_path)
    environment = child_environment(config.cpu_test_mode)
    code = subprocess.run(list(argv), env=environment, stdout=stdout, check=False).returncode
    documents = rank_documents(Path(config.report_path or ""))
    failed = [(rank, d) for rank, d in enumerate(documents) if d.get("status") != "ok"]
    if failed:
        rank, document = failed[0]
        where = f"rank {rank}: " if len(documents) > 1 else ""
        raise CaptureError(f"{where}{document.get('message')}")
    if documents and code == 0:
        return [dict(d.get("report") or {}) for d in documents]
    if code != 0:
        exit_code = code if code > 0 else 128 - code
        raise ScriptExitError(f"the script exited with code {exit_code} before the capture completed; nothing was "
                              "written", exit_code)
    raise CaptureError("the capture process ended without a report; nothing was written")


def _ncu_counters(ncu: str, command: UserCommand, child: CaptureConfig, folder: Path, trace: Trace,
                  stdout: int | None) -> tuple[Trace, int]:
    """Run the script again under ncu for the step after the warm-up; the trace with its counters."""
    config = replace(child, mark_only=True, measure_energy=False, report_path=str(folder / "ncu-report.json"))
    config_path, log = folder / "ncu-capture.json", folder / "ncu.csv"
    _run_child(ncu_run.ncu_argv(ncu, log, command.boot_argv(BOOT, config_path)), config, config_path, stdout)
    return ncu_run.enrich(trace, log)


def run_capture(command: Sequence[str], config: CaptureConfig, ncu: bool = False,
                script_stdout: int | None = None) -> list[CaptureReport]:
    """Capture the user's ``command`` (``python train.py ARGS``, or ``torchrun ... train.py ARGS``) as
    described by ``config``; one report per rank (one without torchrun).

    With ``ncu``, a second run under Nsight Compute adds counters to the trace's kernels. The script's
    standard output goes to the file descriptor ``script_stdout`` (default: this process's). Under torchrun
    rank R's trace goes to ``config.output`` with ``.rankR`` before the suffix (a job of several ranks).
    Raises:
        CaptureError: the capture failed (nothing written).
        ScriptExitError: the script exited with a non-zero code (its ``exit_code``; nothing written).
    """
    user = split_command(command)
    if user.distributed and (ncu or config.gpu_index is not None):
        raise CaptureError("under torchrun each rank captures its own GPU (CUDA device LOCAL_RANK); drop --gpu-index"
                           " and --ncu (an ncu run of one rank is not supported yet)")
    ncu_path = ncu_run.find_ncu() if ncu else None
    with tempfile.TemporaryDirectory(prefix="kdvfs-capture-") as name:
        folder = Path(name)
        child = replace(config, output=str(folder / "trace.json"), command=" ".join(command).removeprefix("-- "),
                        keep_profile=str(folder / "profile.json") if config.keep_profile else None,
                        report_path=str(folder / "report.json"))
        documents = _run_child(user.boot_argv(BOOT, folder / "capture.json"), child, folder / "capture.json",
                               script_stdout)
        reports = [CaptureReport(**document) for document in documents]
        if ncu_path is not None:
            trace, matched = _ncu_counters(ncu_path, user, child, folder, load_trace(Path(child.output)),
                                           script_stdout)
            save_trace(trace, Path(child.output))
            reports = [replace(reports[0], kernels_with_counters=matched)]
        return [_deliver(report, config, folder) for report in reports]


def _deliver(report: CaptureReport, config: CaptureConfig, folder: Path) -> CaptureReport:
    """Copy one rank's trace, the traces of its other step shapes (and the raw recording) from the private folder to
    where the user asked, and remove ``.shape-K`` files of an earlier capture beyond this one's. Files get
    ``.rankR`` only in a job of several ranks (a one-rank torchrun job names its files as without torchrun,
    as its controller does: :attr:`kdvfs.runtime.job.Rank.distributed`)."""
    def place(path: Path) -> Path:
        return rank_path(path, report.rank) if report.world_size > 1 else path

    if config.keep_profile:
        write_text_atomic(place(Path(config.keep_profile)), read_text(place(folder / "profile.json")))
    output = place(Path(config.output))
    captured = report.shapes.get("captured", [])
    others = [(shape_path(place(folder / "trace.json"), k), shape_path(output, k)) for k in range(1, len(captured))]
    for source, target in others:
        save_trace(load_trace(source), target)
    save_trace(load_trace(place(folder / "trace.json")), output)
    for stale in sibling_paths(output)[len(others):]:  # a previous capture's shapes beyond this one's
        stale.unlink()
    shapes = {**report.shapes, "captured": [{**entry, "output": str(shape_path(output, k))}
                                            for k, entry in enumerate(captured)]} if captured else report.shapes
    return replace(report, output=str(output), shapes=shapes)
