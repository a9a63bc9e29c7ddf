"""Fuzzing the trace loader: valid trace files with parts of their JSON replaced, deleted or grown. Every file
either loads into a trace that summarises, estimates and prices without error or numeric warning, or fails
with a one-line KdvfsError; no other exception escapes."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile
from kdvfs.envs.model.cost_tables import build_tables
from kdvfs.envs.model.estimate import estimate_features
from kdvfs.envs.trace.bundled import trace_path
from kdvfs.envs.trace.format import dumps_trace, load_trace
from kdvfs.envs.trace.summary import summarize

Path_ = tuple[str | int, ...]
BASES = {"h200/resnet50-b128": slice(390, 420), "h200/gpt2s-b16": slice(0, 30)}
"""Bundled traces cut to 30 kernels: convolutions with and without counters, and matmuls estimated from shapes."""

SPECIAL = st.sampled_from([0, -1, 1e308, -1e308, 10**400, 2**63, float("nan"), float("inf"), -0.0, True, "", []])
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6) | SPECIAL)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                                            max_size=3), max_leaves=6)


@functools.cache
def _base(name: str) -> str:
    document = json.loads(trace_path(name).read_text())
    document["kernels"] = document["kernels"][BASES[name]]
    return json.dumps(document)


@functools.cache
def _profile() -> GpuProfile:
    return load_profile("h200")


def _paths(node: Any, prefix: Path_ = ()) -> list[Path_]:
    """The path of every value inside ``node`` (keys of objects, indices of lists)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    found = []
    for key, child in items:
        found.append((*prefix, key))
        found += _paths(child, (*prefix, key))
    return found


def _mutate(document: Any, path: Path_, operation: str, value: Any) -> None:
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if operation == "delete":
        del parent[last]
    elif operation == "grow" and isinstance(parent, list):
        parent.insert(int(last), value)
    else:
        parent[last] = value


@st.composite
def mutated_files(draw: st.DrawFn) -> str:
    """A base trace with one to three parts replaced, deleted or grown; each part picked in a section first
    (meta, names, ops, sources, kernels...) so that the many op entries do not crowd out the rest."""
    document = json.loads(_base(draw(st.sampled_from(sorted(BASES)))))
    for _ in range(draw(st.integers(1, 3))):
        sections: dict[Any, list[Path_]] = {}
        for path in _paths(document):
            sections.setdefault(path[0], []).append(path)
        if not sections:
            break
        paths = sections[draw(st.sampled_from(sorted(sections, key=str)))]
        _mutate(document, draw(st.sampled_from(paths)), draw(st.sampled_from(["replace", "delete", "grow"])),
                copy.deepcopy(draw(VALUES)))
    return json.dumps(document)


def _use(path: Path) -> None:
    """Load the file and do what the commands do with a trace."""
    trace = load_trace(path)
    summarize(trace)
    dumps_trace(trace)
    build_tables(estimate_features(trace, _profile()), _profile())


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a NaN or an overflow in the cost tables is a failure too
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(text=mutated_files())
def test_every_mutated_trace_loads_or_is_a_kdvfs_error(text: str, tmp_path: Path) -> None:
    path = tmp_path / "mutated.trace.json"
    path.write_text(text)
    try:
        _use(path)
    except KdvfsError as error:
        assert "\n" not in str(error)


def test_the_unmutated_bases_load_and_price(tmp_path: Path) -> None:
    for name in BASES:
        path = tmp_path / "base.trace.json"
        path.write_text(_base(name))
        _use(path)
