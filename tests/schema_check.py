"""Check a ``--json`` document against its published schema, ``docs/schemas/<name>.schema.json`` (JSON Schema
2020-12). Every command's ``--json`` output has one; tests call :func:`validate` on real output."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import jsonschema

from kdvfs.common.paths import REPO_ROOT

SCHEMA_DIR = REPO_ROOT / "docs" / "schemas"


@cache
def schema(name: str) -> dict[str, Any]:
    """The schema ``docs/schemas/<name>.schema.json``, itself checked against the 2020-12 meta-schema."""
    loaded: dict[str, Any] = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(loaded)
    return loaded


def validate(document: Any, name: str) -> None:
    """Raise ``jsonschema.ValidationError`` naming the first place ``document`` breaks schema ``name``."""
    jsonschema.Draft202012Validator(schema(name), format_checker=jsonschema.FormatChecker()).validate(document)
