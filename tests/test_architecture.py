"""The layout's laws, checked on the source: the dependency direction, no import cycles, no private imports,
and a docstring for every room (package)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kdvfs.common.paths import REPO_ROOT

PACKAGES = ("common", "envs", "agents", "runtime")
FORBIDDEN = {"common": ("envs", "agents", "runtime"), "envs": ("agents", "runtime"), "agents": ("runtime",),
             "runtime": ()}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "kdvfs." + ".".join(parts)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((REPO_ROOT / package).rglob("*.py"))}


SOURCES = _sources()


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every ``import`` and ``from ... import`` in a file, lazy ones included."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def _kdvfs_dependencies(path: Path) -> set[str]:
    """The kdvfs modules a file imports (``from pkg import module`` counts as importing ``pkg.module``)."""
    deps = set()
    for module, names in _imports(path):
        if not module.startswith("kdvfs."):
            continue
        submodules = {f"{module}.{name}" for name in names if f"{module}.{name}" in SOURCES}
        deps |= submodules or {module}
    return deps


def test_every_import_of_kdvfs_names_an_existing_module() -> None:
    missing = {(name, dep) for name, path in SOURCES.items() for dep in _kdvfs_dependencies(path)
               if dep not in SOURCES}
    assert not missing


@pytest.mark.parametrize("package", PACKAGES)
def test_dependencies_flow_one_way(package: str) -> None:
    forbidden = tuple(f"kdvfs.{other}" for other in FORBIDDEN[package])
    wrong = {(name, dep) for name, path in SOURCES.items() if name.startswith(f"kdvfs.{package}")
             for dep in _kdvfs_dependencies(path) if forbidden and dep.startswith(forbidden)}
    assert not wrong


def test_no_import_cycles() -> None:
    graph = {name: _kdvfs_dependencies(path) - {name} for name, path in SOURCES.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep):], dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles


def test_no_private_names_imported_from_another_module() -> None:
    private = {(name, f"{module}.{imported}") for name, path in SOURCES.items()
               for module, names in _imports(path) for imported in names
               if imported.startswith("_") and not imported.startswith("__")}
    assert not private


def test_every_room_says_what_it_owns() -> None:
    silent = [name for name, path in SOURCES.items()
              if path.name == "__init__.py" and not ast.get_docstring(ast.parse(path.read_text()))]
    assert not silent


@pytest.mark.parametrize("pattern", [r"^Array = ", r"^POLICY_SUFFIX = |= \"\.kdvfs-policy\.npz\"",
                                     r"def shipped_policy_path\("])
def test_shared_basics_defined_once(pattern: str) -> None:
    """The array alias, the policy suffix and the shipped-policy path live in ``kdvfs.common`` alone."""
    regex = re.compile(pattern, re.MULTILINE)
    defining = [name for name, path in SOURCES.items() if regex.search(path.read_text())]
    assert len(defining) == 1 and defining[0].startswith("kdvfs.common."), defining


CONTROLLER = "kdvfs.runtime.controller"
CONTROLLER_LAYERS = (("config", "event_log"), ("model",), ("timing",), ("measurement",), ("decisions",),
                     ("shapes",), ("control",), ("controller",), ("training",))
"""The controller's rooms (and its top-level modules) from the bottom up: a module imports only from its own
layer and those below it. The package itself (``kdvfs.runtime.controller``, the public API) stands above all."""


def _controller_layer(module: str) -> int:
    if module == CONTROLLER:
        return len(CONTROLLER_LAYERS)
    room = module.removeprefix(f"{CONTROLLER}.").split(".")[0]
    return next(i for i, rooms in enumerate(CONTROLLER_LAYERS) if room in rooms)


def test_every_controller_module_has_a_layer() -> None:
    rooms = {room for layer in CONTROLLER_LAYERS for room in layer}
    unplaced = {name for name in SOURCES if name.startswith(f"{CONTROLLER}.")
                and name.removeprefix(f"{CONTROLLER}.").split(".")[0] not in rooms}
    assert not unplaced


def test_the_controller_imports_downward_only() -> None:
    """No module of a controller room imports from a room above its own (:data:`CONTROLLER_LAYERS`)."""
    upward = {(name, dep) for name, path in SOURCES.items() if name.startswith(f"{CONTROLLER}.")
              for dep in _kdvfs_dependencies(path) if dep.startswith(CONTROLLER)
              and _controller_layer(dep) > _controller_layer(name)}
    assert not upward


def test_controller_module_docstrings_are_short() -> None:
    """A controller module's docstring says what it owns, its units, invariants and failure modes, in at most 15
    lines; the reasoning lives in docs/design/controller.md."""
    long = {name: len(doc.splitlines()) for name, path in SOURCES.items() if name.startswith(CONTROLLER)
            and (doc := ast.get_docstring(ast.parse(path.read_text()), clean=False)) and len(doc.splitlines()) > 15}
    assert not long
