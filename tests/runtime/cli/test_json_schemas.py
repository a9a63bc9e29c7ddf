"""Every ``--json`` output has its schema in ``docs/schemas`` and every schema is checked against real output:
the parser's ``--json`` options against one table (command -> schema), each schema named in a test's
``validate`` call (or referred to by one that is), and the outputs no other test checks."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.gpu.profiles import available_profiles
from kdvfs.runtime.cli import build_parser, main
from kdvfs.runtime.testing.fake_nvml import EnergyFakeNvml
from tests.runtime.microbench.test_calibrate import CPU_CALIBRATE
from tests.schema_check import SCHEMA_DIR, schema, strict_loads, validate

SCHEMAS = {  # the command line before --json -> its output's schema, docs/schemas/<name>.schema.json
    ("capture",): "capture",
    ("calibrate",): "calibrate",
    ("model", "validate"): "model-validate",
    ("trace", "show"): "trace-show",
    ("trace", "list"): "trace-list",
    ("gpus",): "gpus-list",
    ("gpus", "list"): "gpus-list",
    ("gpus", "show"): "gpus-show",
    ("gpus", "local"): "gpus-local",
    ("plan",): "plan",
    ("compare",): "compare",
    ("policy", "list"): "policy-list",
    ("predict",): "predict",
    ("evaluate",): "evaluate",
    ("run",): "run-summary",
    ("report",): "report",
}
SHARED = ("error",)  # the failure document of every command, and what the command schemas refer to
SCHEMA_FILES = sorted(path.name.removesuffix(".schema.json") for path in SCHEMA_DIR.glob("*.schema.json"))
VALIDATED = re.compile(r'validate\(.*, "([a-z0-9-]+)"\)')


def _json_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The command path of every parser in the tree that takes ``--json``."""
    if any("--json" in action.option_strings for action in parser._actions):
        yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _json_commands(child, (*path, name))


def _referred(name: str) -> set[str]:
    """The schemas ``name`` refers to (``"$ref": "range.schema.json#/..."``), by name."""
    text = (SCHEMA_DIR / f"{name}.schema.json").read_text()
    return set(re.findall(r'"\$ref": "([a-z0-9-]+)\.schema\.json', text))


def test_every_json_option_has_its_schema_in_the_table() -> None:
    assert set(_json_commands(build_parser())) == set(SCHEMAS)


@pytest.mark.parametrize("name", sorted({*SCHEMAS.values(), *SHARED}))
def test_every_schema_of_the_table_is_published(name: str) -> None:
    assert name in SCHEMA_FILES, f"docs/schemas/{name}.schema.json is missing"


@pytest.mark.parametrize("name", SCHEMA_FILES)
def test_every_schema_is_a_2020_12_schema_named_for_its_file(name: str) -> None:
    loaded = schema(name)
    assert loaded["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert loaded["$id"] == f"{name}.schema.json" and loaded["title"]


def test_every_schema_is_checked_by_a_test() -> None:
    texts = [path.read_text() for path in (REPO_ROOT / "tests").rglob("*.py")]
    used = {name for text in texts for name in VALIDATED.findall(text)}
    used |= {referred for name in used & set(SCHEMA_FILES) for referred in _referred(name)}
    assert set(SCHEMA_FILES) - used == set()


def test_the_pattern_finds_validate_calls() -> None:
    assert VALIDATED.findall('validate(strict_loads(capsys.readouterr().out), "gpus-local")') == ["gpus-local"]


@pytest.mark.parametrize("name", available_profiles())
def test_gpus_show_of_every_shipped_profile(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "show", name, "--json"]) == 0
    validate(strict_loads(capsys.readouterr().out), "gpus-show")


def test_read_only_calibrate_json(shared_nvml: EnergyFakeNvml, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CPU_CALIBRATE, "-o", str(tmp_path / "lab.yaml"), "--json"]) == 0
    result = strict_loads(capsys.readouterr().out)
    validate(result, "calibrate")
    assert result["clock_control"] is None and result["profile"] == str(tmp_path / "lab.yaml")


def test_a_document_with_nan_is_refused() -> None:
    with pytest.raises(ValueError, match="NaN is not JSON"):
        strict_loads(json.dumps({"time_mape": float("nan")}))
