"""The ``kdvfs`` console script as a user meets it: light commands import no heavy library, ``--version``,
``--json`` lists, a reader that stops early, and missing shipped data as a one-line error (exit 2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kdvfs
from kdvfs.common.paths import GPU_PROFILE_DIR, HOME_VARIABLE
from tests.schema_check import strict_loads, validate

HEAVY = ("torch", "stable_baselines3", "matplotlib", "gymnasium", "scipy", "tensorboard")
SCRIPT = shutil.which("kdvfs", path=str(Path(sys.executable).parent))


def kdvfs_cli(*argv: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != HOME_VARIABLE}
    if home is not None:
        env[HOME_VARIABLE] = str(home)
    assert SCRIPT is not None
    return subprocess.run([SCRIPT, *argv], capture_output=True, text=True, env=env, check=False)


@pytest.mark.parametrize("argv", [["--help"], ["gpus"], ["trace", "list"]])
def test_light_commands_import_no_heavy_library(argv: list[str]) -> None:
    code = ("import contextlib, io, sys\nfrom kdvfs.runtime.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n    main({argv!r})\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_version() -> None:
    result = kdvfs_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"kdvfs {kdvfs.__version__}"


def test_list_commands_print_json() -> None:
    traces = strict_loads(kdvfs_cli("trace", "list", "--json").stdout)
    validate(traces, "trace-list")
    small = next(t for t in traces if t["name"] == "h200/gpt3xl-1layer-b4")
    assert Path(small["path"]).is_file() and small["path"].endswith("gpt3xl-1layer-b4.trace.json")
    for argv in (["gpus", "--json"], ["gpus", "list", "--json"]):
        profiles = strict_loads(kdvfs_cli(*argv).stdout)
        validate(profiles, "gpus-list")
        h200 = next(p for p in profiles if p["name"] == "h200")
        assert h200["model"] == "NVIDIA H200" and h200["clock_pairs"] == 220 and h200["switching_latency_s"] == 0.006
    assert "clock pairs" in kdvfs_cli("gpus").stdout


def test_a_reader_that_stops_early_is_no_traceback() -> None:
    assert SCRIPT is not None
    with subprocess.Popen([SCRIPT, "gpus", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()
        assert process.wait() == 1 and b"Traceback" not in process.stderr.read()


@pytest.mark.parametrize("argv", [["trace", "list"], ["gpus"], ["demo", "--out", "unused"]])
def test_missing_data_is_an_error_not_an_empty_list(argv: list[str], tmp_path: Path) -> None:
    result = kdvfs_cli(*argv, home=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and f"{HOME_VARIABLE}={tmp_path}" in result.stderr


def test_kdvfs_home_replaces_the_shipped_data(tmp_path: Path) -> None:
    (tmp_path / "configs" / "gpus").mkdir(parents=True)
    shutil.copy(GPU_PROFILE_DIR / "b200.yaml", tmp_path / "configs" / "gpus")
    result = kdvfs_cli("gpus", "--json", home=tmp_path)
    assert [p["name"] for p in json.loads(result.stdout)] == ["b200"]
