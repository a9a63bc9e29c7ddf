"""The process ``kdvfs run`` runs the user's script in:
``python -m kdvfs.runtime.controller.training.boot CONFIG SCRIPT ARGS``.

It opens the :class:`~kdvfs.runtime.controller.controller.Controller` described by CONFIG (with ``own_process``,
in a process of its own: :mod:`~kdvfs.runtime.controller.training.own_process`, under torchrun too, one a rank;
else here, in the training process; every check happens before the script starts; a failed one is exit code 2
with the clocks untouched), registers a global
``torch.optim`` optimizer-step hook that calls :meth:`Controller.step`, and runs the unmodified script as
``__main__`` with the same runner as ``kdvfs capture``. Whatever way the script ends, the controller is
closed (clocks restored) and the summary is written to the report file for the parent. The script's own
exit code passes through. Under torchrun every worker runs this module (torchrun's ``-m`` entry), each
with its own controller (in its own process, with ``own_process``: the process inherits the rank's
environment and joins the job's lockstep), GPU and watchdog, and writes its own report (``report.rankR.json``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from torch.optim.optimizer import register_optimizer_step_post_hook

from kdvfs.common.errors import KdvfsError
from kdvfs.runtime.child import run_target
from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.controller import Controller
from kdvfs.runtime.controller.training.integrations import AnyController
from kdvfs.runtime.controller.training.own_process import ProcessController
from kdvfs.runtime.job import write_rank_report


@contextlib.contextmanager
def step_hook(controller: AnyController) -> Iterator[None]:
    """Call ``controller.step()`` after every optimizer step."""
    handle = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: controller.step())
    try:
        yield
    finally:
        handle.remove()


def main(argv: Sequence[str]) -> int:
    """Run the script ``argv[1:]`` under the controller configured by the file ``argv[0]``."""
    config = ControllerConfig.load(Path(argv[0]))
    controller = ProcessController(config) if config.own_process else Controller(config=config)
    try:
        controller.__enter__()
    except KdvfsError as error:
        write_rank_report(config.report_path, {"status": "error", "message": str(error)})
        return 2
    try:
        with step_hook(controller):
            run_target(argv[1:])
    finally:
        controller.close()
        summary = None if controller.summary is None else controller.summary.to_json()
        write_rank_report(config.report_path, {"status": "ok", "summary": summary, "windows": controller.windows})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
