"""Running a user's Python training command under a kdvfs bootstrap (shared by ``kdvfs capture`` and
``kdvfs run``): checking the command, giving the child this kdvfs on its path, and running the command in the child.

A torchrun command (``torchrun OPTIONS train.py ARGS`` or ``python -m torch.distributed.run ...``) keeps its
launcher options and gets the bootstrap as its ``-m`` entry, so that every worker runs the script under
kdvfs and the launcher stays as it was."""

from __future__ import annotations

import os
import re
import runpy
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import kdvfs
from kdvfs.common.errors import KdvfsError

_PYTHON = re.compile(r"python[\d.]*(\.exe)?")
_TORCHRUN = re.compile(r"torchrun(\.exe)?")
TORCH_RUN_MODULE = "torch.distributed.run"
USAGE = ("write the command after `--` as `python train.py ARGS`, `python -m package.module ARGS` or "
         "`torchrun [OPTIONS] train.py ARGS`")
MODULE_FLAGS = ("-m", "--module")
REFUSED_LAUNCHER_FLAGS = ("--no-python", "--no_python", "--run-path", "--run_path")


class CommandError(KdvfsError):
    """The user's command cannot be run under kdvfs."""


@dataclass(frozen=True)
class UserCommand:
    """The user's command, split: the ``launcher`` (``python``, or torchrun with its options) and the
    ``target`` (``SCRIPT ARGS`` or ``-m MODULE ARGS``) every training process runs."""

    launcher: tuple[str, ...]
    target: tuple[str, ...]
    distributed: bool = False

    def boot_argv(self, boot_module: str, config_path: Path) -> list[str]:
        """The command that runs ``target`` under ``python -m boot_module CONFIG`` in every training process
        (under torchrun, its ``-m`` entry: each worker, not the launcher, runs the bootstrap)."""
        return [*self.launcher, "-m", boot_module, str(config_path), *self.target]


def _check_target(words: Sequence[str], target: Sequence[str]) -> None:
    if not target or (target[0] == "-m" and len(target) < 2) or (target[0].startswith("-") and target[0] != "-m"):
        raise CommandError(f"{' '.join(words)!r}: no script or module to run; {USAGE}")
    if target[0] != "-m" and not Path(target[0]).is_file():
        raise CommandError(f"{target[0]}: no such script; check the path")


def _split_torchrun(words: list[str], head: int, tool: str) -> UserCommand:
    """``words[:head]`` start torchrun (``torchrun`` or ``python -m torch.distributed.run``); its options,
    the script and the script's arguments follow (torch's own launcher parser finds where)."""
    from torch.distributed.run import get_args_parser

    options = words[head:]
    try:
        parsed = get_args_parser().parse_args(options)
    except SystemExit:
        raise CommandError(f"{' '.join(words)!r}: torchrun cannot parse these options; {USAGE}") from None
    script_at = len(options) - 1 - len(parsed.training_script_args)
    refused = [flag for flag in options[:script_at] if flag.split("=")[0] in REFUSED_LAUNCHER_FLAGS]
    if refused:
        raise CommandError(f"torchrun {refused[0]}: {tool} runs each worker's Python under its bootstrap, which "
                           "needs torchrun to start Python itself; drop the option")
    launcher = [flag for flag in options[:script_at] if flag not in MODULE_FLAGS]
    target = (["-m"] if parsed.module else []) + options[script_at:]
    _check_target(words, target)
    return UserCommand((*words[:head], *launcher), tuple(target), distributed=True)


def split_command(command: Sequence[str], tool: str = "kdvfs") -> UserCommand:
    """The launcher and the target of the user's command: ``python SCRIPT ARGS``, ``python -m MODULE ARGS``,
    ``torchrun [OPTIONS] SCRIPT ARGS`` or ``python -m torch.distributed.run [OPTIONS] SCRIPT ARGS``.

    ``tool`` names the kdvfs command in error messages (e.g. ``"kdvfs capture"``).
    """
    words = list(command)
    if words[:1] == ["--"]:
        words = words[1:]
    if not words:
        raise CommandError(f"no command to run; {USAGE}")
    interpreter = words[0]
    if _TORCHRUN.fullmatch(Path(interpreter).name):
        return _split_torchrun(words, 1, tool)
    if not _PYTHON.fullmatch(Path(interpreter).name):
        raise CommandError(f"{interpreter!r} is not a Python interpreter: {tool} runs Python training scripts; {USAGE}")
    if words[1:3] == ["-m", TORCH_RUN_MODULE]:
        return _split_torchrun(words, 3, tool)
    _check_target(words, words[1:])
    return UserCommand((interpreter,), tuple(words[1:]))


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
