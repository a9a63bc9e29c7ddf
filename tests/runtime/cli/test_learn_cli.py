"""``kdvfs evaluate`` with the shipped H200 policy, and ``kdvfs train``: argument checks, stage lines, progress bar."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from kdvfs.agents.learned.training import train as training
from kdvfs.agents.learned.training.ppo import PPO_CONFIG_DIR
from kdvfs.agents.learned.training.train import whole_rollouts
from kdvfs.common.config import to_plain
from kdvfs.common.paths import BUNDLED_TRACE_DIR, shipped_policy_path
from kdvfs.runtime.cli import main
from tests.agents.conftest import tiny_config
from tests.schema_check import strict_loads, validate

TRACE = "h200/gpt3xl-1layer-b4"
BERT = str(BUNDLED_TRACE_DIR / "h200" / "workloads" / "bert-{}.trace.json.gz")


def test_evaluate_json_has_the_compare_fields_plus_a_policy_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--policy", str(shipped_policy_path("h200")), "--trace", TRACE, "--gpu", "h200",
                 "--json", "--samples", "2"]) == 0
    rows = strict_loads(capsys.readouterr().out)
    validate(rows, "evaluate")
    assert {"policy", "latency-optimal", "auto", "power-limit"} <= {row["method"] for row in rows}
    for row in rows:
        assert set(row) == {"method", "energy_saved_pct", "slowdown_pct", "switches", "solve_s", "budget_pct",
                            "power_limit_w", "power_limit_source", "range"}
        assert row["budget_pct"] == pytest.approx(1.0)
        low, high = row["range"]["slowdown_pct"]
        assert low < row["slowdown_pct"] < high or low == row["slowdown_pct"] == high == 0
        searched = row["method"] == "power-limit"
        assert row["power_limit_source"] == ("searched" if searched else "profile default")
        assert (row["power_limit_w"] < 700.0) if searched else row["power_limit_w"] == 700.0


def test_evaluate_with_references_refuses_another_power_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--policy", "h200", "--trace", TRACE, "--reference", TRACE, "--gpu", "h200",
                 "--power-limit-w", "500"]) == 2
    err = capsys.readouterr().err
    assert "drop --power-limit-w" in err and err.count("\n") == 1


def test_evaluate_refuses_a_policy_of_another_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--policy", str(shipped_policy_path("h200")), "--trace", TRACE,
                 "--gpu", "rtx3080ti"]) == 2
    assert "trained for GPU 'h200'" in capsys.readouterr().err


def test_train_refuses_a_config_for_another_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = str(PPO_CONFIG_DIR / "rtx3080ti.yaml")
    assert main(["train", "--gpu", "h200", "--config", config, "--out", str(tmp_path)]) == 2
    assert "trains for 'rtx3080ti'" in capsys.readouterr().err
    assert main(["train", "--gpu", "h200", "--timesteps", "0", "--out", str(tmp_path)]) == 2


def test_train_refuses_a_run_folder_that_holds_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "policy.kdvfs-policy.npz").write_bytes(b"an earlier run's policy")
    assert main(["train", "--gpu", "h200", "--out", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run} holds files of another run" in err and "--force" in err, err
    assert [p.name for p in run.iterdir()] == ["policy.kdvfs-policy.npz"]
    assert (run / "policy.kdvfs-policy.npz").read_bytes() == b"an earlier run's policy"
    config = str(PPO_CONFIG_DIR / "rtx3080ti.yaml")  # with --force the folder is taken: the next check speaks
    assert main(["train", "--gpu", "h200", "--config", config, "--out", str(run), "--force"]) == 2
    assert "trains for 'rtx3080ti'" in capsys.readouterr().err


def test_train_runs_with_the_default_progress_bar(tmp_path: Path) -> None:
    """Its stage lines: test_train_reports_its_stages_and_rounds_timesteps_up_to_whole_rollouts (``--no-progress``;
    one tiny training each)."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(to_plain(tiny_config()), sort_keys=False))
    assert main(["train", "--gpu", "h200", "--config", str(config), "--out", str(tmp_path / "bar")]) == 0
    assert (tmp_path / "bar" / "policy.kdvfs-policy.npz").is_file()


def test_evaluate_episodes_adds_within_budget_and_is_seeded(capsys: pytest.CaptureFixture[str]) -> None:
    command = ["evaluate", "--policy", str(shipped_policy_path("h200")), "--trace", TRACE, "--gpu", "h200",
               "--budget", "0.01", "--latency-ms", "3", "--episodes", "2", "--seed", "4", "--json"]
    assert main(command) == 0
    rows = strict_loads(capsys.readouterr().out)
    validate(rows, "evaluate")
    assert {"policy", "latency-optimal", "static", "auto"} <= {row["method"] for row in rows}
    for row in rows:
        assert set(row) == {"method", "energy_saved_pct", "slowdown_pct", "switches", "solve_s", "budget_pct",
                            "within_budget", "episodes", "planned_budget_pct"}
        assert row["episodes"] == 2 and 0.0 <= row["within_budget"] <= 1.0
    assert main(command) == 0
    again = json.loads(capsys.readouterr().out)
    assert [{**r, "solve_s": 0} for r in again] == [{**r, "solve_s": 0} for r in rows]
    assert main([*command[:-1]]) == 0
    assert "disturbed episodes" in capsys.readouterr().out
    with pytest.raises(SystemExit) as caught:
        main([*command[:12], "0"])
    assert caught.value.code == 2 and "must be a positive integer" in capsys.readouterr().err


def test_train_reports_its_stages_and_rounds_timesteps_up_to_whole_rollouts(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]
                                                                            ) -> None:
    tiny = tiny_config()
    rollout = tiny.ppo.n_steps * tiny.n_envs
    assert whole_rollouts(1, tiny.ppo.n_steps, tiny.n_envs) == rollout
    assert whole_rollouts(rollout, tiny.ppo.n_steps, tiny.n_envs) == rollout
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(to_plain(tiny), sort_keys=False))
    assert main(["train", "--gpu", "h200", "--config", str(config), "--timesteps", "1", "--seed", "7",
                 "--no-progress", "--out", str(tmp_path / "run")]) == 0
    assert tiny.seed != 7 and yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["seed"] == 7
    out = capsys.readouterr().out
    assert f"1 timesteps rounded up to {rollout}" in out and f"PPO for {rollout} timesteps" in out, out
    assert f"trained {rollout} timesteps" in out
    for stage in ("loading PyTorch", "pricing every training and validation step once on h200",
                  "imitation warm start on 1 training steps", "comparing PPO with the bar"):
        assert stage in out


def test_train_several_seeds_prices_the_steps_once(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Each seed trains into its own folder with its seed recorded; the steps are priced for the first only; every
    seed records the revision read at the start (the code the process runs), though the tree moves on."""
    revisions = iter(f"rev{i}" for i in range(100))
    monkeypatch.setattr(training, "git_revision", lambda: next(revisions))
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(to_plain(tiny_config("residual-h200")), sort_keys=False))
    assert main(["train", "--gpu", "h200", "--config", str(config), "--timesteps", "1", "--seed", "3", "4",
                 "--no-progress", "--out", str(tmp_path / "run")]) == 0
    for seed in (3, 4):
        assert yaml.safe_load((tmp_path / "run" / f"seed-{seed}" / "config.yaml").read_text())["seed"] == seed
        assert (tmp_path / "run" / f"seed-{seed}" / "ppo.kdvfs-policy.npz").is_file()
        assert json.loads((tmp_path / "run" / f"seed-{seed}" / "run.json").read_text())["git_revision"] == "rev0"
    out = capsys.readouterr().out
    assert out.count("pricing every training and validation step") == 1 and out.count("trained ") == 2, out


def test_train_refuses_a_seed_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--gpu", "h200", "--seed", "1", "1", "--out", str(tmp_path / "run")]) == 2
    assert "names a seed twice" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_evaluate_with_references_says_what_it_scored(capsys: pytest.CaptureFixture[str]) -> None:
    references = [BERT.format(shape) for shape in ("b32-s128", "b32-s512", "b16-s384")]
    assert main(["evaluate", "--policy", "h200", "--reference", *references, "--trace", BERT.format("b32-s256"),
                 "--gpu", "h200", "--slowdown", "0.02"]) == 0
    header = capsys.readouterr().out.split("\n\n")[0].replace("\n", " ")
    assert header.startswith(f"policy h200 on 1 executed step ({BERT.format('b32-s256')}), predicted from 3 "
                             f"references ({references[0]}, "), header
    assert re.search(r"GPU h200, budget 2\.0%, switching latency 6 ms \(the profile's\); plans of predicted steps at "
                     r"\d+% of the budget \(the prediction margin\)$", header), header
