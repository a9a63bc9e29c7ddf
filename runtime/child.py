"""Running a user's Python training command under a kdvfs bootstrap (shared by ``kdvfs capture`` and
``kdvfs run``): checking the command, giving the child this kdvfs on its path, and running the command in the child."""

from __future__ import annotations

import os
import re
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

import kdvfs
from kdvfs.envs.common.errors import KdvfsError

_PYTHON = re.compile(r"python[\d.]*(\.exe)?")
USAGE = "write the command after `--` as `python train.py ARGS` or `python -m package.module ARGS`"


class CommandError(KdvfsError):
    """The user's command cannot be run under kdvfs."""


def split_command(command: Sequence[str], tool: str = "kdvfs") -> tuple[str, list[str]]:
    """The interpreter and the target (``SCRIPT ARGS`` or ``-m MODULE ARGS``) of the user's command.

    ``tool`` names the kdvfs command in error messages (e.g. ``"kdvfs capture"``).
    """
    words = list(command)
    if words[:1] == ["--"]:
        words = words[1:]
    if not words:
        raise CommandError(f"no command to run; {USAGE}")
    interpreter, target = words[0], words[1:]
    if not _PYTHON.fullmatch(Path(interpreter).name):
        raise CommandError(f"{interpreter!r} is not a Python interpreter: {tool} runs Python training scripts; {USAGE}")
    if not target or (target[0] == "-m" and len(target) < 2) or (target[0].startswith("-") and target[0] != "-m"):
        raise CommandError(f"{' '.join(words)!r}: no script or module to run; {USAGE}")
    if target[0] != "-m" and not Path(target[0]).is_file():
        raise CommandError(f"{target[0]}: no such script; check the path")
    return interpreter, target


def child_environment(cpu_test_mode: bool = False) -> dict[str, str]:
    """The child's environment: this kdvfs first on PYTHONPATH, so its bootstrap is the one that runs.

    ``cpu_test_mode`` (a CPU-only script whose steps are timed in the training thread's CPU time): one
    intra-op thread (``OMP_NUM_THREADS=1``), so that the thread's CPU time is the step's work rather than
    spin-waits on helper threads that a busy machine deschedules.
    """
    root = str(Path(kdvfs.__file__).parent.parent)
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    single_thread = {"OMP_NUM_THREADS": "1"} if cpu_test_mode else {}
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **single_thread}


def run_target(target: Sequence[str]) -> None:
    """Run ``SCRIPT ARGS`` or ``-m MODULE ARGS`` as ``__main__``; a ``sys.exit(0)`` is a normal end."""
    try:
        if target[0] == "-m":
            sys.argv = [target[1], *target[2:]]
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(target)
            sys.path.insert(0, str(Path(target[0]).resolve().parent))
            runpy.run_path(target[0], run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise
