"""`kdvfs plan` and `kdvfs compare`: JSON shapes, files written, clear errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kdvfs.envs.trace.bundled import open_trace, trace_path
from kdvfs.envs.trace.format import save_trace
from kdvfs.runtime.cli import main
from tests.agents.planners.test_slack import two_ranks
from tests.schema_check import strict_loads, validate

SMALL = "h200/gpt3xl-1layer-b4"
FIELDS = {"method", "energy_saved_pct", "slowdown_pct", "switches", "solve_s", "budget_pct", "power_limit_w",
          "power_limit_source"}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_plan_writes_a_schedule(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, text, _ = run(capsys, "plan", "--trace", SMALL, "--gpu", "h200", "--method", "latency-optimal",
                        "--budget", "0.02", "-o", str(out))
    assert code == 0 and "latency-optimal" in text
    plan = json.loads(out.read_text())
    assert plan["format"] == "kdvfs-schedule" and plan["kernels"] == 115
    assert plan["segments"][0]["start_kernel"] == 0
    assert plan["executed"]["step_time_s"] <= plan["auto"]["step_time_s"] * 1.02 + 1e-12


def test_compare_json_has_the_documented_fields(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plot = tmp_path / "pareto.png"
    code, text, _ = run(capsys, "compare", "--trace", SMALL, "--gpu", "h200", "--budget", "0.01,0.05",
                        "--latency-ms", "0", "--json", "--plot", str(plot))
    rows = strict_loads(text)
    validate(rows, "compare")
    assert code == 0 and {tuple(sorted(r)) for r in rows} == {tuple(sorted(FIELDS | {"range"}))}
    assert {r["budget_pct"] for r in rows} == {1.0, 5.0}
    ilp = {r["budget_pct"]: r for r in rows if r["method"] == "ilp"}
    assert ilp[5.0]["energy_saved_pct"] >= ilp[1.0]["energy_saved_pct"] - 1e-9
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_empty_trace_and_bad_budgets_are_clear_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    document = json.loads(trace_path(SMALL).read_text())
    document["kernels"] = []
    empty = tmp_path / "empty.trace.json"
    empty.write_text(json.dumps(document))
    code, _, err = run(capsys, "plan", "--trace", str(empty), "--gpu", "h200", "--method", "ilp", "--budget", "0.01")
    assert code == 2 and "has no kernels" in err and err.count("\n") == 1
    for command in (["plan", "--method", "ilp"], ["compare"]):
        with pytest.raises(SystemExit) as caught:
            main([*command, "--trace", SMALL, "--gpu", "h200", "--budget", "-0.01"])
        assert caught.value.code == 2 and "must be a finite fraction >= 0" in capsys.readouterr().err


def test_a_plan_over_its_budget_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    problem = ["--trace", SMALL, "--gpu", "h200", "--budget", "0.01"]
    code, text, _ = run(capsys, "plan", *problem, "--method", "ilp")
    assert code == 0 and "over budget:" in text and "against a 1.00% budget" in text
    code, text, _ = run(capsys, "plan", *problem, "--method", "latency-optimal")
    assert code == 0 and "over budget" not in text


def test_compare_adds_a_two_sided_range_to_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, _ = run(capsys, "compare", "--trace", SMALL, "--gpu", "h200", "--budget", "0.01", "--json",
                        "--samples", "2", "--seed", "1")
    rows = strict_loads(text)
    validate(rows, "compare")
    assert code == 0 and all(set(r) - FIELDS == {"range"} for r in rows)
    for row in rows:
        spread = row["range"]
        assert spread["parameter_samples"] == 2 and spread["seed"] == 1 and spread["coverage"] == 0.9
        for key in ("energy_saved_pct", "slowdown_pct"):
            low, high = spread[key]
            if row["method"] in ("auto", "reactive"):
                assert low == row[key] == high == 0  # auto against itself: exact
            else:
                assert low < row[key] < high
    code, text, _ = run(capsys, "compare", "--trace", SMALL, "--gpu", "h200", "--budget", "0.01",
                        "--latency-ms", "0", "--samples", "1")
    assert code == 0 and "ranges (90%)" in text and "% [" in text


def test_plan_json_has_the_schedules_range(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, _ = run(capsys, "plan", "--trace", SMALL, "--gpu", "h200", "--method", "static", "--budget", "0.01",
                        "--json", "--samples", "0")
    document = strict_loads(text)
    validate(document, "plan")
    assert code == 0 and document["range"]["parameter_samples"] == 0
    low, high = document["range"]["energy_saved_pct"]
    assert low < document["energy_saved_pct"] < high


def test_compare_marks_the_rows_over_budget(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, _ = run(capsys, "compare", "--trace", SMALL, "--gpu", "h200", "--budget", "0.01")
    marked = {line.split("│")[2].strip() for line in text.splitlines() if " ! │" in line}
    assert code == 0 and "ilp" in marked and "latency-optimal" not in marked and "over budget as executed" in text


def test_plan_of_a_waiting_rank_uses_its_slack_unless_told_not_to(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    base = open_trace(SMALL)
    base = replace(base, meta=replace(base.meta, measurements={}))
    path = tmp_path / "step.rank1.trace.json"
    save_trace(two_ranks(base, 0.02 * base.step_time_s, 0.05 * base.step_time_s)[1], path)
    plans = {}
    for flags in ([], ["--no-slack"]):
        out = tmp_path / f"plan{len(flags)}.json"
        code, text, _ = run(capsys, "plan", "--trace", str(path), "--gpu", "h200", "--method", "ilp", "--budget",
                            "0.01", "-o", str(out), *flags)
        assert code == 0 and ("rank slack" in text) is not flags
        plans[bool(flags)] = json.loads(out.read_text())
    assert plans[False]["slack_s"] == pytest.approx(0.05 * base.step_time_s) and plans[True]["slack_s"] == 0.0
    assert plans[False]["budget"] > 0.05 and plans[True]["budget"] == 0.01
    assert {p["job_budget"] for p in plans.values()} == {0.01}
    assert plans[False]["executed"]["energy_j"] < plans[True]["executed"]["energy_j"]


def test_compare_shows_the_power_limit_method_and_the_priced_limit(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, _ = run(capsys, "compare", "--trace", SMALL, "--gpu", "h200", "--budget", "0.02", "--json",
                        "--power-limit-w", "600")
    rows = strict_loads(text)
    validate(rows, "compare")
    searched = [row for row in rows if row["method"] == "power-limit"]
    assert code == 0 and len(searched) == 1 and searched[0]["power_limit_source"] == "searched"
    assert 200.0 <= searched[0]["power_limit_w"] <= 600.0 and searched[0]["slowdown_pct"] <= 2.0 + 1e-6
    priced = {(r["power_limit_w"], r["power_limit_source"]) for r in rows if r is not searched[0]}
    assert priced == {(600.0, "requested")}
    code, text, _ = run(capsys, "compare", "--trace", SMALL, "--gpu", "h200", "--budget", "0.02")
    assert code == 0 and "power limit 700 W (profile default)" in text and "power-limit (" in text
