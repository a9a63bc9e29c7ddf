"""Arguments shared by the CLI commands: budgets (allowed step-time increases over auto), and output paths
checked before any long work."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kdvfs.common.errors import KdvfsError
from kdvfs.common.units import UnitError, checked_budget, checked_latency_s


def budget(text: str) -> float:
    """An argparse type: a budget (allowed step-time increase over auto) as a finite fraction in
    [0, MAX_BUDGET] (0.01 = 1%; :func:`kdvfs.common.units.checked_budget`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; budgets are fractions (0.01 = 1%)") from None
    try:
        return checked_budget(value)
    except UnitError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def latency_ms(text: str) -> float:
    """An argparse type: a switching latency in milliseconds, finite, in [0, MAX_LATENCY_MS]
    (:func:`kdvfs.common.units.checked_latency_s`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds") from None
    try:
        checked_latency_s(value)
    except UnitError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def watts(text: str) -> float:
    """An argparse type: a power limit in W, finite and positive (the board's range is checked against the trace
    and the GPU profile)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of watts") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} W must be a finite number of watts > 0")
    return value


def add_power_limit(parser: argparse.ArgumentParser) -> None:
    """``--power-limit-w``: the power limit to price the step at (default: the one it was recorded under)."""
    parser.add_argument("--power-limit-w", type=watts, metavar="W", help="price the step at this board power limit "
                        "(default: the limit the trace was recorded under, else the GPU profile's default)")


def sample_count(text: str) -> int:
    """An argparse type: a number of sampled profiles, an integer >= 0 (0: no ranges)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of samples") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0 (0: no ranges)")
    return value


def budget_list(text: str) -> list[float]:
    """An argparse type: comma-separated budgets, each as :func:`budget` takes them."""
    values = [budget(item) for item in text.split(",") if item]
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} holds no budget; give fractions such as 0.01 or 0,0.01,0.05")
    return values


def add_output(parser: argparse._ActionsContainer, help: str, *, dest: str = "output", **kwargs: Any) -> None:
    """A command's output flag: ``-o``, ``--output`` and ``--out`` alike."""
    parser.add_argument("-o", "--output", "--out", dest=dest, type=Path, help=help, **kwargs)


def _writable_folder(folder: Path, target: Path) -> None:
    """Raise unless ``folder`` (created on demand with its parents) can receive ``target``."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise KdvfsError(f"cannot write {target}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise KdvfsError(f"cannot write {target}: the folder {existing} is not writable; pick another path")


def check_output_file(path: Path | None, inputs: Iterable[Path | str | None] = ()) -> None:
    """Check, before any work, that ``path`` can be written as a file and is none of ``inputs``."""
    if path is None:
        return
    if path.is_dir():
        raise KdvfsError(f"{path} is a folder; give the output a file name")
    _writable_folder(path.absolute().parent, path)
    for source in inputs:
        if source is not None and _same_file(Path(source), path):
            raise KdvfsError(f"{path} is also an input of this command; write the output to another path")


def _same_file(source: Path, path: Path) -> bool:
    """Whether ``source`` exists and is ``path`` (through links and relative forms alike)."""
    if not source.exists():
        return False
    if path.exists():
        return os.path.samefile(source, path)
    return source.resolve() == path.resolve()


def resolved(name: str | None, resolve: Callable[[str], Path]) -> Path | str | None:
    """An input as the file it names (a bundled name resolved by ``resolve``), or as given where it names none
    (the error comes when it is read: under torchrun a rank's own file may stand in for it); a folder that
    names no bundled file is refused at once (``resolve``'s error)."""
    if name is None:
        return None
    try:
        return resolve(name)
    except KdvfsError:
        if Path(name).is_dir():
            raise
        return name


def command_paths(command: Iterable[str]) -> list[str]:
    """The existing files a command line names (the training script, its data, ``--flag=PATH`` values): the
    inputs of ``kdvfs run`` and ``kdvfs capture`` after ``--``, which no output may overwrite."""
    paths = []
    for item in command:
        for candidate in (item, item.partition("=")[2]):
            if candidate and os.path.isfile(candidate):
                paths.append(candidate)
    return paths


def check_output_folder(path: Path | None) -> None:
    """Check, before any work, that ``path`` is or can become a writable folder."""
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise KdvfsError(f"{path} is a file; give a folder for the output")
    _writable_folder(path.absolute(), path)
