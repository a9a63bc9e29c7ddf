"""The process ``kdvfs capture`` runs the user's script in:
``python -m kdvfs.runtime.capture.capture_boot CONFIG SCRIPT ARGS``.

It installs a global ``torch.optim`` optimizer-step hook that calls :meth:`Capture.step` (or, for
``--ncu`` runs, :meth:`StepMarker.step`), runs the unmodified script as ``__main__`` (``SCRIPT ARGS`` or
``-m MODULE ARGS``), and ends it once the capture completed by raising :class:`CaptureStop` from the
hook. It writes a JSON report for the parent: ``{"status": "ok", "report": {...}}`` or
``{"status": "error", "message": ...}``. Exit codes: 0 captured, 2 a kdvfs error, otherwise the script's
own (an uncaught exception in the script is exit code 1, as without kdvfs). Under torchrun every worker
runs this module (torchrun's ``-m`` entry) and writes its own report, ``report.rankR.json``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook

from kdvfs.common.errors import KdvfsError
from kdvfs.runtime.capture.capture_config import CaptureConfig
from kdvfs.runtime.capture.capture_errors import CaptureError, CaptureStop
from kdvfs.runtime.capture.ncu_run import StepMarker
from kdvfs.runtime.capture.session import Capture
from kdvfs.runtime.child import run_target
from kdvfs.runtime.job import write_rank_report


@contextlib.contextmanager
def _step_hook(step: Callable[[], bool]) -> Iterator[None]:
    """Call ``step`` after every optimizer step; stop the script when it returns True or fails."""

    def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            done = step()
        except KdvfsError as error:
            raise CaptureStop(error) from None
        if done:
            raise CaptureStop()

    handle = register_optimizer_step_post_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _capture(config: CaptureConfig, target: Sequence[str]) -> dict[str, Any]:
    """Run the script under the capture (or the ncu step marker); the capture's report."""
    if config.mark_only:
        marker = StepMarker(config.warmup)
        try:
            with _step_hook(marker.step):
                run_target(target)
        except CaptureStop:
            return {}
        raise CaptureError(f"the script ended after {marker.steps_seen} training steps, before the step after "
                           f"warm-up step {config.warmup} that ncu profiles; let the script run longer")
    capture = Capture.from_config(config)
    try:
        with capture, _step_hook(capture.step):
            run_target(target)
    except CaptureStop as stop:
        if stop.error is not None:
            raise stop.error from None
    assert capture.report is not None
    return capture.report.as_json()


def main(argv: Sequence[str]) -> int:
    """Run the capture described by the config file ``argv[0]`` around the script ``argv[1:]``."""
    config = CaptureConfig.load(Path(argv[0]))
    try:
        report = _capture(config, argv[1:])
    except KdvfsError as error:
        write_rank_report(config.report_path, {"status": "error", "message": str(error)})
        return 2
    write_rank_report(config.report_path, {"status": "ok", "report": report})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
