"""``--json`` commands print exactly one JSON document on stdout: native solver output and progress go
elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kdvfs
from kdvfs.runtime.cli import main
from tests.schema_check import strict_loads, validate

SCRIPT = shutil.which("kdvfs", path=str(Path(sys.executable).parent))
WORKTREE = str(Path(kdvfs.__file__).resolve().parent.parent)


def kdvfs_json(*argv: str) -> subprocess.CompletedProcess[str]:
    """The console script run on this checkout's code."""
    assert SCRIPT is not None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [WORKTREE, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([SCRIPT, *argv], capture_output=True, text=True, env=env, check=False)


def test_compare_json_keeps_the_solvers_debug_output_off_stdout() -> None:
    # on this GPU HiGHS prints MIP debug lines from C++ straight to descriptor 1
    result = kdvfs_json("compare", "--trace", "h200/gpt3xl-1layer-b4", "--gpu", "rtx3080ti", "--budget", "0.01",
                        "--samples", "2", "--json")
    assert result.returncode == 0, result.stderr
    rows = strict_loads(result.stdout)
    validate(rows, "compare")
    assert {row["method"] for row in rows} >= {"auto", "ilp"}


def test_plan_json_is_one_document_with_the_written_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "plan.json"
    argv = ["plan", "--trace", "h200/gpt3xl-1layer-b4", "--gpu", "h200", "--budget", "0.01", "--method", "ilp"]
    assert main([*argv, "-o", str(output), "--json"]) == 0
    document = strict_loads(capsys.readouterr().out)
    validate(document, "plan")
    assert document["output"] == str(output)
    assert document["method"] == "ilp" and document["energy_saved_pct"] > 0
    assert {key: document[key] for key in json.loads(output.read_text())} == json.loads(output.read_text())
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["output"] is None


def test_json_commands_print_a_document_when_they_fail(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import sys\nsys.exit(3)\n")
    capture = kdvfs_json("capture", "--cpu-test-mode", "--no-energy", "--json", "-o", str(tmp_path / "t.json"), "--",
                         sys.executable, str(script))
    assert capture.returncode == 3 and strict_loads(capture.stdout)["exit_code"] == 3, capture.stderr
    validate(strict_loads(capture.stdout), "error")
    refused = kdvfs_json("trace", "show", "nope/none", "--json")
    assert refused.returncode == 2 and "unknown" in strict_loads(refused.stdout)["error"]
    validate(strict_loads(refused.stdout), "error")
