"""A capture of a run whose steps vary: one trace per captured step shape, found by the file naming convention.

``kdvfs capture -o run.trace.json`` writes the most frequent shape's step to ``run.trace.json`` (so every
consumer of one trace keeps working) and each other captured shape's step beside it, numbered from 1 in
the order the capture lists them: ``run.shape-1.trace.json``, ``run.shape-2.trace.json``, ... (``.shape-K``
before the suffix: ``.trace.json``, ``.trace.json.gz``, ``.json``, ``.json.gz``). Every trace of one capture
holds the same ``meta.shape_distribution``; :func:`load_trace_set` checks it, so a file left from another
capture is an error, not a silent member.

The joules of a window of mixed steps are predicted shape by shape (:func:`window_prediction`): each step of
the window counts the predicted joules of its own shape, and each shape's first step its host set-up.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from kdvfs.common.errors import TraceFormatError
from kdvfs.common.files import split_suffix
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.shape import ShapeAxes, StepShape
from kdvfs.envs.trace.trace import Trace

_SHAPE_NAME = re.compile(r"\.shape-(\d+)$")


def shape_path(path: str | Path, number: int) -> Path:
    """The file of the capture's ``number``-th other shape (``run.trace.json``, 2 -> ``run.shape-2.trace.json``);
    ``path`` itself for 0."""
    path = Path(path)
    if number == 0:
        return path
    stem, suffix = split_suffix(path.name)
    return path.with_name(f"{stem}.shape-{number}{suffix}")


def main_path(path: str | Path) -> Path:
    """The main trace of a ``.shape-K`` file (``run.shape-2.trace.json`` -> ``run.trace.json``); ``path`` itself
    for any other file."""
    path = Path(path)
    stem, suffix = split_suffix(path.name)
    match = _SHAPE_NAME.search(stem)
    return path.with_name(f"{stem[:match.start()]}{suffix}") if match else path


def sibling_paths(path: str | Path) -> list[Path]:
    """The existing ``.shape-K`` files beside the trace ``path``, by K (K = 1, 2, ... with no gap: a file after a
    missing number belongs to no capture of ``path`` and is left out)."""
    path = Path(path)
    stem, suffix = split_suffix(path.name)
    numbers = set()
    for candidate in path.parent.glob(f"{glob.escape(stem)}.shape-*{glob.escape(suffix)}"):
        name_stem, name_suffix = split_suffix(candidate.name)
        match = _SHAPE_NAME.search(name_stem)
        if match and name_suffix == suffix and name_stem[:match.start()] == stem:
            numbers.add(int(match.group(1)))
    found: list[Path] = []
    while len(found) + 1 in numbers:
        found.append(shape_path(path, len(found) + 1))
    return found


def load_trace_set(paths: str | Path | Sequence[str | Path]) -> list[Trace]:
    """Every trace of the captures at ``paths``: each file, then its ``.shape-K`` siblings (module docstring).

    A trace without siblings is a set of one. A path that is itself a ``.shape-K`` file is loaded alone.
    Raises:
        TraceFormatError: a file is unreadable, or a sibling's ``meta.shape_distribution`` differs from its
            main trace's (a file left from another capture: delete it or capture again).
    """
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    traces: list[Trace] = []
    for item in items:
        main_path = Path(item)
        main = load_trace(main_path)
        traces.append(main)
        if _SHAPE_NAME.search(split_suffix(main_path.name)[0]):
            continue
        for sibling_path in sibling_paths(main_path):
            sibling = load_trace(sibling_path)
            if sibling.meta.shape_distribution != main.meta.shape_distribution:
                raise TraceFormatError(f"{sibling_path} is from another capture than {main_path} (their shape "
                                       "distributions differ); delete it or capture again")
            traces.append(sibling)
    return traces


def tokens_scaled(shape: StepShape, captured: Mapping[StepShape, float]) -> float:
    """A per-step figure (joules, seconds) of ``shape`` from the captured shape nearest in size (the sum of the
    shapes' variables, :meth:`ShapeAxes.size`: the tokens of a step of one sequence length), scaled by the ratio
    of sizes; the captured figure itself when ``shape`` was captured."""
    if shape in captured:
        return captured[shape]
    if not captured:
        raise ValueError("no captured shape to predict from")
    axes = ShapeAxes.of([shape, *captured])
    nearest = min(captured, key=lambda known: (abs(axes.size(known) - axes.size(shape)), known))
    return captured[nearest] * axes.size(shape) / max(axes.size(nearest), 1)


def window_prediction(distribution: Sequence[tuple[StepShape, int]], captured: Mapping[StepShape, float],
                      uncaptured: Callable[[StepShape], float] | None = None,
                      first_seen: float = 0.0, first_seen_steps: float | None = None) -> dict[str, float]:
    """The predicted total of a window of mixed steps: the sum over its steps of their own shape's prediction.

    Args:
        distribution: the window's shapes and step counts (``meta.shape_distribution``).
        captured: the predicted per-step figure (e.g. joules) of each captured shape.
        uncaptured: the figure of a shape not in ``captured``; default :func:`tokens_scaled` (the nearest captured
            shape scaled by size). The hook for a step model that predicts unseen shapes.
        first_seen: what a step that pays one-time set-up costs on top (the capture's ``first_seen_energy_j``).
        first_seen_steps: how many of the window's steps paid it (the capture's ``window_first_seen_steps``, as
            the fit of ``first_seen`` counted them); None: the first step of each shape.
    Returns:
        ``{"total", "steps", "captured_steps"}``: the window's predicted total, its steps, and how many of
        them had a captured shape (the rest are predicted by ``uncaptured``).
    """
    predict = uncaptured or (lambda shape: tokens_scaled(shape, captured))
    paying = len(distribution) if first_seen_steps is None else first_seen_steps
    total = sum(steps * (captured[shape] if shape in captured else predict(shape))
                for shape, steps in distribution) + first_seen * paying
    return {"total": float(total), "steps": float(sum(steps for _, steps in distribution)),
            "captured_steps": float(sum(steps for shape, steps in distribution if shape in captured))}
