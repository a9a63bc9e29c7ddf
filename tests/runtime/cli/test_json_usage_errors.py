"""Usage errors with ``--json`` anywhere before ``--`` (issue 50): stdout holds one ``{"error": ...}`` document
(``kdvfs run``'s with ``"gpu_restored": true``), stderr one line, exit code 2; without ``--json``, stdout
stays empty."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdvfs.runtime.cli import main, wants_json
from tests.schema_check import strict_loads, validate

TRACE, GPU = ["--trace", "h200/gpt2s-b16"], ["--gpu", "h200"]
VALID = {  # each command's valid options (the required ones first, then how many they are), in groups an option
    # and its value stay together in
    "plan": ([TRACE, GPU, ["--method", "ilp"], ["--budget", "0.01"], ["--latency-ms", "6"]], 4),
    "compare": ([TRACE, GPU, ["--budget", "0.01"], ["--latency-ms", "6"]], 3),
    "evaluate": ([["--policy", "h200"], TRACE, GPU, ["--budget", "0.01"], ["--episodes", "2"]], 3),
    "predict": ([TRACE, GPU], 2),
    "run": ([["--policy", "h200"], TRACE, ["--budget", "0.01"], ["--latency-ms", "6"]], 2),
}
BAD_VALUES = {
    "--budget": ["abc", "-0.1", "2", "nan", "inf", "1e9", ""],
    "--latency-ms": ["99999", "-1", "nan", "x"],
    "--episodes": ["0", "-2", "x", "1.5"],
    "--method": ["nope", "ILP2"],
}


@st.composite
def bad_command_lines(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A command's valid options with one fault (a bad value, a missing option, an unknown flag) and ``--json``
    at a random place among them."""
    command = draw(st.sampled_from(sorted(VALID)))
    options, required = VALID[command]
    groups = [list(group) for group in options]
    faults = ["missing", "unknown"] + [name for name in BAD_VALUES if any(g[0] == name for g in groups)]
    fault = draw(st.sampled_from(faults))
    if fault == "missing":
        groups.pop(draw(st.integers(0, required - 1)))
    elif fault == "unknown":
        groups.append([draw(st.sampled_from(["--bogus", "--gpu-idx", "-x", "--budgets=0.1"]))])
    else:
        groups = [[name, draw(st.sampled_from(BAD_VALUES[name]))] if name == fault else [name, *rest]
                  for name, *rest in groups]
    groups = draw(st.permutations(groups))
    groups.insert(draw(st.integers(0, len(groups))), ["--json"])
    tail = ["--", "python", "train.py", "--json"] if command == "run" else []
    return command, [command, *(token for group in groups for token in group), *tail]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad_command_lines())
def test_usage_errors_with_json_print_an_error_document(capsys: pytest.CaptureFixture[str],
                                                        case: tuple[str, list[str]]) -> None:
    command, argv = case
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    captured = capsys.readouterr()
    document = strict_loads(captured.out)
    validate(document, "error")
    assert set(document) == ({"error", "gpu_restored"} if command == "run" else {"error"}), document
    assert document["error"].startswith(f"kdvfs {command}") or document["error"].startswith("kdvfs:"), document
    assert document.get("gpu_restored", True) is True
    assert captured.err.count("\n") == 1 and ": error: " in captured.err, captured.err


@pytest.mark.parametrize("argv", [["--json"], ["trace", "show", "--json"], ["gpus", "show", "--json"],
                                  ["report", "--json"], ["policy", "list", "--json", "--bogus"]])
def test_json_usage_errors_of_commands_without_options(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    validate(strict_loads(capsys.readouterr().out), "error")


def test_json_after_the_double_dash_is_the_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    assert wants_json(["run", "--js", "--", "x.py"]) and not wants_json(["run", "--", "python", "x.py", "--json"])
    with pytest.raises(SystemExit):
        main(["run", "--policy", "h200", "--budget", "abc", "--", "python", "x.py", "--json"])
    assert capsys.readouterr().out == ""
