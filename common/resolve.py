"""One rule for arguments that are "a bundled name or a path" (GPU profiles, workloads, PPO configs, traces)."""

from __future__ import annotations

import os
from pathlib import Path

from kdvfs.common.errors import DataMissingError, KdvfsError
from kdvfs.common.paths import HOME_VARIABLE


def shipped_names(folder: Path, suffix: str) -> list[str]:
    """Names of the files bundled under ``folder`` ending in ``suffix``: their relative paths without it.

    Raises:
        DataMissingError: the folder holds no such file (the installation lacks its data).
    """
    names = sorted(p.relative_to(folder).as_posix()[: -len(suffix)] for p in folder.rglob(f"*{suffix}"))
    if not names:
        home = os.environ.get(HOME_VARIABLE)
        where = f"{HOME_VARIABLE}={home} lacks them" if home else "kdvfs is installed without its data"
        raise DataMissingError(f"{folder}: no *{suffix} files ({where}); reinstall kdvfs, or set {HOME_VARIABLE} "
                               "to a folder holding kdvfs's configs/, data/ and policies/")
    return names


def _rank_files_hint(missing: Path) -> str:
    """A hint at the per-rank files a torchrun capture or run writes in place of ``missing``
    (``step.trace.json`` -> ``step.rank0.trace.json``, ...), or ``""`` when there are none."""
    head, _, tail = missing.name.partition(".")
    ranked = sorted(missing.parent.glob(f"{head}.rank*.{tail}")) if missing.parent.is_dir() else []
    if not ranked:
        return ""
    shown = ", ".join(str(path) for path in ranked[:4]) + (", ..." if len(ranked) > 4 else "")
    return f"; a torchrun job wrote one per rank: {shown}; pass a rank's file"


def _folder_error(folder: Path, suffix: str, kind: str) -> str:
    """Why a folder is no ``kind`` file, naming up to three such files it holds (what the user may have meant)."""
    inside = sorted(str(path) for path in folder.glob(f"*{suffix}") if path.is_file())
    held = f"; it holds {', '.join(inside[:3])}{', ...' if len(inside) > 3 else ''}" if inside else ""
    return f"{folder} is a folder, expected a {kind} file or a bundled name{held}"


def resolve_shipped(name_or_path: str | Path, folder: Path, suffix: str, kind: str, *, error: type[KdvfsError],
                    name_kind: str | None = None, hint: str = "", hidden: tuple[str, ...] = ()) -> Path:
    """An existing file ``name_or_path``, else the bundled ``folder/<name><suffix>``.

    Args:
        kind: what the file holds, e.g. ``"GPU profile"``; name_kind: what a bundled name names (default ``kind``).
        error: the error raised when neither exists: a folder is named as one, a name with a file suffix
            (``x.yaml``) is a missing file, any other name is unknown and the message lists the bundled ones
            (:class:`DataMissingError` where none are bundled, ``hidden`` left out of the list); hint is
            appended to it.
    """
    candidate = Path(name_or_path)
    if candidate.is_file():
        return candidate
    bundled = folder / f"{name_or_path}{suffix}"
    if bundled.is_file():
        return bundled
    if candidate.is_dir():
        raise error(_folder_error(candidate, suffix, kind))
    if candidate.suffix:
        raise error(f"{candidate}: no such {kind} file{_rank_files_hint(candidate)}")
    names = shipped_names(folder, suffix)
    folded = [name for name in names if name.lower() == str(name_or_path).lower()]
    if len(folded) == 1:  # names are case-insensitive: --gpu H200 is h200
        return folder / f"{folded[0]}{suffix}"
    known = ", ".join(name for name in names if name not in hidden)
    raise error(f"unknown {name_kind or kind} {str(name_or_path)!r}; known: {known} "
                f"(bundled: {folder}/<name>{suffix}); or pass a {kind} file{hint}")
