"""``--json`` commands print exactly one JSON document on stdout: native solver output and progress go
elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import kdvfs

SCRIPT = shutil.which("kdvfs", path=str(Path(sys.executable).parent))
WORKTREE = str(Path(kdvfs.__file__).resolve().parent.parent)


def kdvfs_json(*argv: str) -> subprocess.CompletedProcess[str]:
    """The console script run on this checkout's code."""
    assert SCRIPT is not None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [WORKTREE, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([SCRIPT, *argv], capture_output=True, text=True, env=env, check=False)


def test_compare_json_keeps_the_solvers_debug_output_off_stdout() -> None:
    # on this GPU HiGHS prints MIP debug lines from C++ straight to descriptor 1 during the uncertainty sample
    result = kdvfs_json("compare", "--trace", "h200/gpt3xl-1layer-b4", "--gpu", "rtx3080ti", "--budget", "0.01",
                        "--uncertainty", "--samples", "2", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert {row["method"] for row in rows} >= {"auto", "ilp"}
