"""``evaluate --reference``: the JSON's shape, the controller side never reading the executed step, one-line
CLI errors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kdvfs.agents.learned.policy.frozen import FrozenPolicy
from kdvfs.agents.learned.shape_evaluation import METHODS, controller_for, evaluate_shapes, evaluate_step
from kdvfs.common.paths import REPO_ROOT, shipped_policy_path
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.step_model import StepModel
from kdvfs.envs.trace.format import load_trace
from kdvfs.envs.trace.trace import Trace
from kdvfs.runtime.cli import main
from tests.schema_check import strict_loads, validate

WORKLOADS = REPO_ROOT / "data" / "traces" / "h200" / "workloads"
REFERENCES = [str(WORKLOADS / f"bert-{s}.trace.json.gz") for s in ("b32-s128", "b32-s512", "b16-s384")]
EXECUTED = str(WORKLOADS / "bert-b32-s256.trace.json.gz")


@pytest.fixture(scope="module")
def policy() -> FrozenPolicy:
    return FrozenPolicy.load(shipped_policy_path("h200"), load_profile("h200"))


def _scrambled(trace: Trace) -> Trace:
    """``trace`` with its kernel durations permuted (same shape, other kernels' times)."""
    order = np.random.default_rng(0).permutation(len(trace))
    return Trace(trace.meta, tuple(replace(k, duration_s=float(trace.duration_s[j]))
                                   for k, j in zip(trace.kernels, order, strict=True)))


def test_json_has_every_method_per_step_and_a_summary(policy: FrozenPolicy) -> None:
    references = [load_trace(p) for p in REFERENCES]
    result = evaluate_shapes(policy, references, [("bert-s256", load_trace(EXECUTED))], load_profile("h200"), 0.01,
                             0.0)
    assert set(result) == {"steps", "summary", "prediction_margin"}
    margin = result["prediction_margin"]
    assert 0 < margin["margin"] <= 1 and len(margin["slowdowns_pct"]) <= len(references)  # type: ignore[index]
    step = result["steps"][0]  # type: ignore[index]
    assert step["trace"] == "bert-s256" and set(step["methods"]) == set(METHODS) and step["covered"] is True
    for row in step["methods"].values():
        assert set(row) == {"energy_saved_pct", "slowdown_pct", "within_budget"}
    for row in result["summary"].values():  # type: ignore[attr-defined]
        assert set(row) == {"energy_saved_pct", "slowdown_pct", "within_budget"}
    assert step["methods"]["auto"] == {"energy_saved_pct": 0.0, "slowdown_pct": 0.0, "within_budget": 1.0}
    assert step["methods"]["oracle"]["within_budget"] == 1.0


def test_the_controller_side_never_reads_the_executed_step(policy: FrozenPolicy) -> None:
    profile = load_profile("h200")
    model = StepModel.fit([load_trace(p) for p in REFERENCES])
    executed = load_trace(EXECUTED)
    scrambled = _scrambled(executed)
    plain = controller_for(model, executed, policy, profile, 0.01, None, False)
    other = controller_for(model, scrambled, policy, profile, 0.01, None, False)
    assert plain.predicted is not None and other.predicted is not None
    assert np.array_equal(plain.predicted.costs.time_s, other.predicted.costs.time_s)
    assert plain.env is not None and other.env is not None
    assert np.array_equal(plain.env.static_rows, other.env.static_rows)  # what the policy sees ahead
    first_plain, _ = plain.env.reset(options={"step": 0, "budget": 0.01})
    first_other, _ = other.env.reset(options={"step": 0, "budget": 0.01})
    assert np.array_equal(first_plain, first_other)  # the first decision's observation
    results = [evaluate_step(model, t, policy, profile, 0.01, None, None, 0) for t in (executed, scrambled)]
    assert results[0]["oracle"] != results[1]["oracle"]


def test_cli_prints_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--policy", "h200", "--reference", *REFERENCES, "--trace", EXECUTED, "--gpu", "h200",
                 "--slowdown", "0.01", "--latency-ms", "0", "--json"]) == 0
    result = strict_loads(capsys.readouterr().out)
    validate(result, "evaluate")
    assert [step["trace"] for step in result["steps"]] == [EXECUTED]


@pytest.mark.parametrize(("extra", "message"), [
    (["--reference", str(WORKLOADS / "gpt2s-compiled-b16.trace.json.gz")], "no meta.step_shape"),
    (["--slowdown", "0.01,0.02", "--reference", *REFERENCES], "one --slowdown"),
    ([], "one step without --reference"),
])
def test_cli_errors_are_one_line(extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    traces = [EXECUTED] if extra else [EXECUTED, EXECUTED]
    assert main(["evaluate", "--policy", "h200", "--trace", *traces, "--gpu", "h200", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
