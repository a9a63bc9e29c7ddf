"""What produced an output: every run writes ``run.json`` (command, resolved config, git revision, seed)
next to what it wrote, and, when the revision is ``+dirty``, ``run.diff`` (``git diff HEAD`` of the tracked
files, so the code that ran can be rebuilt)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kdvfs.common.files import write_text_atomic
from kdvfs.common.paths import REPO_ROOT


def git_revision() -> str:
    """The repository's HEAD commit, with ``+dirty`` for uncommitted tracked changes, or ``unknown``."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=REPO_ROOT, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def write_run_record(folder: Path, config: dict[str, Any], seed: int | None = None,
                     revision: str | None = None) -> Path:
    """Write ``folder/run.json`` describing this run (``revision``: the git revision the run records everywhere;
    None: read now), and ``folder/run.diff`` beside it when that revision is ``+dirty``; returns run.json's
    path."""
    record = {"command": sys.argv, "config": config, "seed": seed,
              "git_revision": git_revision() if revision is None else revision,
              "date_utc": datetime.now(UTC).isoformat(timespec="seconds"), "python": sys.version.split()[0],
              "machine": platform.node()}
    path = Path(folder) / "run.json"
    if str(record["git_revision"]).endswith("+dirty"):
        record["git_diff"] = "run.diff"
        write_text_atomic(path.with_name("run.diff"), tracked_diff())
    write_text_atomic(path, json.dumps(record, indent=1, default=str) + "\n")
    return path


def tracked_diff() -> str:
    """``git diff HEAD`` of the tracked files (empty when git cannot say)."""
    try:
        return subprocess.run(["git", "diff", "HEAD", "--no-color", "--no-ext-diff"], capture_output=True,
                              text=True, cwd=REPO_ROOT, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""
