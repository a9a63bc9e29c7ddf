"""Names a user types (issue 40): shipped policies by short name and their list, GPU and trace names in any
case, and a hint at a torchrun capture's per-rank trace files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kdvfs.agents.learned.policy.shipped import policy_source_path, shipped_policies
from kdvfs.common.errors import KdvfsError
from kdvfs.common.paths import POLICY_DIR
from kdvfs.runtime.cli import main
from tests.schema_check import strict_loads, validate


def test_shipped_policies_have_short_names_and_a_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert "h200" in shipped_policies()
    assert policy_source_path("h200") == POLICY_DIR / "h200.kdvfs-policy.npz"
    assert policy_source_path("H200") == POLICY_DIR / "h200.kdvfs-policy.npz"
    with pytest.raises(KdvfsError, match=r"unknown shipped policy 'nope'; known: .*h200"):
        policy_source_path("nope")
    assert main(["policy", "list", "--json"]) == 0
    listed = strict_loads(capsys.readouterr().out)
    validate(listed, "policy-list")
    assert {"name": "h200", "path": str(POLICY_DIR / "h200.kdvfs-policy.npz")} in listed
    assert main(["policy", "list"]) == 0
    assert "h200" in capsys.readouterr().out.split()


def test_gpu_and_trace_names_in_any_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "show", "H200", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "h200"
    assert main(["trace", "show", "H200/GPT3XL-1layer-b4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kernels_per_step"] > 0


def test_a_missing_trace_hints_at_the_ranks_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for rank in (0, 1):
        (tmp_path / f"step.rank{rank}.trace.json").write_text("{}")
    argv = ["plan", "--trace", str(tmp_path / "step.trace.json"), "--gpu", "h200", "--budget", "0.01", "--method",
            "ilp"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no such trace file" in err and "step.rank0.trace.json" in err and "step.rank1.trace.json" in err


def test_a_file_that_is_no_policy_gets_no_unpickling_advice(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    fake = tmp_path / "x.kdvfs-policy.npz"
    fake.write_text("not a policy")
    assert main(["evaluate", "--policy", str(fake), "--trace", "h200/gpt3xl-1layer-b4", "--gpu", "h200"]) == 2
    err = capsys.readouterr().err
    assert "not a kdvfs policy file" in err and "pickle" not in err and "trust" not in err, err


def test_evaluate_takes_a_shipped_policy_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--policy", "h200", "--trace", "h200/gpt3xl-1layer-b4", "--gpu", "h200", "--json"]) == 0
    rows = strict_loads(capsys.readouterr().out)
    validate(rows, "evaluate")
    validate(rows, "compare")  # as `kdvfs compare --json`, the policy's rows added
    assert "policy" in {row["method"] for row in rows}
