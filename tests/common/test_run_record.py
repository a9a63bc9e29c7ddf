"""The run record names the code that ran: its revision, and the diff when the tree was dirty."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from kdvfs.common.paths import REPO_ROOT
from kdvfs.common.run_record import git_revision, write_run_record


def test_a_clean_revision_writes_no_diff(tmp_path: Path) -> None:
    path = write_run_record(tmp_path, {"a": 1}, seed=3, revision="0123abc")
    record = json.loads(path.read_text())
    assert record["git_revision"] == "0123abc" and record["seed"] == 3 and record["config"] == {"a": 1}
    assert "git_diff" not in record and not (tmp_path / "run.diff").exists()


def test_a_dirty_revision_writes_the_tracked_diff(tmp_path: Path) -> None:
    path = write_run_record(tmp_path, {}, revision="0123abc+dirty")
    record = json.loads(path.read_text())
    assert record["git_diff"] == "run.diff"
    expected = subprocess.run(["git", "diff", "HEAD", "--no-color", "--no-ext-diff"], capture_output=True,
                              text=True, cwd=REPO_ROOT, check=False).stdout
    assert (tmp_path / "run.diff").read_text() == expected


def test_the_revision_read_now_is_the_checkout_s() -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT,
                          check=False).stdout.strip()
    assert git_revision().split("+")[0] in (head, "unknown")
