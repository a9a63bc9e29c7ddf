"""Arms of one controller-benchmark process (``benchmarks/h200/controller.py run --within``): the order of their window
blocks, and the report's split per arm and pair-by-pair comparison (``benchmarks/reports/controller_arms.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import benchmarks.h200.controller
import benchmarks.reports.controller_arms
from kdvfs.common.paths import REPO_ROOT


@pytest.fixture(scope="module")
def modules() -> dict[str, ModuleType]:
    return {"controller_arms": benchmarks.reports.controller_arms, "controller_h200": benchmarks.h200.controller}


def _window(on: bool, elapsed_s: float, arm: str | None) -> dict[str, Any]:
    window: dict[str, Any] = {"controller": on, "steps": 10, "elapsed_s": elapsed_s, "summary": None}
    if arm is not None:
        window["arm"] = arm
    return window


def _block(arm: str | None, with_s: float) -> list[dict[str, Any]]:
    """One ABBA block of four windows: two pairs whose with-windows take ``with_s`` and the others 1 s."""
    return [_window(True, with_s, arm), _window(False, 1.0, arm), _window(False, 1.0, arm),
            _window(True, with_s, arm)]


def test_each_round_starts_one_arm_later(modules: dict[str, ModuleType]) -> None:
    order = modules["controller_arms"].arm_order([["a"], ["b"], ["c"]], rounds=4)
    assert order == [["a"], ["b"], ["c"], ["b"], ["c"], ["a"], ["c"], ["a"], ["b"], ["a"], ["b"], ["c"]]
    assert modules["controller_arms"].arm_order([[]], rounds=2) == [[], []]


def test_a_process_is_split_per_arm_and_only_its_own_keeps_the_profile(modules: dict[str, ModuleType]) -> None:
    arms = modules["controller_arms"]
    document = {"label": "w", "profile": "w.profile.json.gz", "log": [{"event": "decision"}],
                "windows": _block("", 1.02) + _block("online=false", 1.05) + _block("", 1.03)}
    own, other = arms.split_arms(document)
    assert own["label"] == "w" and own["profile"] == "w.profile.json.gz" and len(own["windows"]) == 8
    assert "within" not in own and own["log"] == document["log"]
    assert other["label"] == "w[online=false]" and other["within"] == "w"
    assert other["profile"] is None and other["log"] == [] and len(other["windows"]) == 4


def test_a_process_of_one_arm_stays_as_it_is(modules: dict[str, ModuleType]) -> None:
    arms = modules["controller_arms"]
    older = {"label": "w", "profile": None, "log": [], "windows": _block(None, 1.02)}  # no "arm": an older run
    assert arms.split_arms(older) == [older]
    one = {"label": "w", "profile": None, "log": [], "windows": _block("anchors=false", 1.02)}
    assert arms.split_arms(one) == [one]


def test_arms_are_compared_with_their_process_pair_by_pair(modules: dict[str, ModuleType]) -> None:
    arms = modules["controller_arms"]
    documents = [{"label": "w"}, {"label": "w[x=1]", "within": "w"}, {"label": "v[y=0]"}]
    compared = arms.arm_differences(documents, {"w": [0.02, 0.03], "w[x=1]": [0.05, 0.01], "v[y=0]": [0.0]})
    assert list(compared) == ["w[x=1]"]
    assert compared["w[x=1]"]["against"] == "w"
    assert compared["w[x=1]"]["differences"] == pytest.approx([0.03, -0.02])


def test_a_variant_of_a_workload_not_run_is_refused_before_anything_is_written(
        modules: dict[str, ModuleType], tmp_path: Path) -> None:
    harness = modules["controller_h200"]
    with pytest.raises(SystemExit, match="no workload 'gpt3xl-b4'"):
        harness.run(tmp_path / "out", cpu_test=False, policy=None, only=["gpt2s-b16"],
                    variants=["gpt3xl-b4:anchors=false"])
    with pytest.raises(SystemExit, match="no workload 'nope'"):
        harness.run(tmp_path / "out", cpu_test=False, policy=None, variants=["nope:anchors=false"], within=True)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("end_to_end", [True, False])
def test_a_cpu_run_with_arms_reports_each_arm_against_its_process(tmp_path: Path, end_to_end: bool) -> None:
    """The harness and its report end to end on the CPU (``--cpu-test``: the tiny model, the fake NVML), with
    and without its end-to-end ``kdvfs run``."""
    script = [sys.executable, "-m", "benchmarks.h200.controller"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([*script, "run", str(tmp_path), "--cpu-test", "--variant", "gpt-tiny:anchors=false", "--within",
                    *([] if end_to_end else ["--no-end-to-end"])], check=True, env=env, capture_output=True,
                   cwd=REPO_ROOT)
    assert (json.loads((tmp_path / "run.json").read_text())["cli"] is None) is not end_to_end
    child = json.loads((tmp_path / "gpt-tiny.json").read_text())
    assert [w["arm"] for w in child["windows"]] == [""] * 8 + ["anchors=false"] * 8
    subprocess.run([*script, "report", str(tmp_path), "--cpu-test"], check=True, env=env, capture_output=True,
                   cwd=REPO_ROOT)
    result = json.loads((tmp_path / "controller_h200.json").read_text())
    assert set(result["overhead"]) == {"gpt-tiny", "gpt-tiny[anchors=false]"}
    assert result["arms"]["gpt-tiny[anchors=false]"]["against"] == "gpt-tiny"
    assert len(result["arms"]["gpt-tiny[anchors=false]"]["differences"]) == 4
    assert ("end-to-end: not run" in (tmp_path / "controller_h200.md").read_text()) is not end_to_end
    assert "## Arms of one process" in (tmp_path / "controller_h200.md").read_text()
