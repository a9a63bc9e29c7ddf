"""Check a ``--json`` document against its published schema, ``docs/schemas/<name>.schema.json`` (JSON Schema
2020-12). Every command's ``--json`` output has one; tests call :func:`validate` on real output (parsed with
:func:`strict_loads`, which refuses the NaN and Infinity that ``json.dumps`` writes but JSON does not know).
A schema refers to another by its file name (``"$ref": "range.schema.json#/$defs/change"``)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from kdvfs.common.paths import REPO_ROOT

SCHEMA_DIR = REPO_ROOT / "docs" / "schemas"


@cache
def schema(name: str) -> dict[str, Any]:
    """The schema ``docs/schemas/<name>.schema.json``, itself checked against the 2020-12 meta-schema."""
    loaded: dict[str, Any] = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(loaded)
    return loaded


def _retrieve(uri: str) -> Resource[Any]:
    """A schema another refers to by file name (``range.schema.json``)."""
    return Resource.from_contents(schema(uri.removesuffix(".schema.json")), default_specification=DRAFT202012)


def validate(document: Any, name: str) -> None:
    """Raise ``jsonschema.ValidationError`` naming the first place ``document`` breaks schema ``name``."""
    validator = jsonschema.Draft202012Validator(schema(name), registry=Registry(retrieve=_retrieve),
                                                format_checker=jsonschema.FormatChecker())
    validator.validate(document)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON: a --json document must hold finite numbers only")


def strict_loads(text: str) -> Any:
    """``json.loads`` that raises ``ValueError`` on ``NaN``, ``Infinity`` and ``-Infinity``."""
    return json.loads(text, parse_constant=_no_constant)
