"""The layout's laws, checked on the source: the dependency direction, no import cycles (benchmarks included), no
private imports, a docstring for every room (package), benchmarks imported by package path."""

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


def _benchmark_sources() -> dict[str, Path]:
    """The benchmarks' modules by their import name (``benchmarks.h200.overhead``)."""
    return {_module_name(p).removeprefix("kdvfs."): p for p in sorted((REPO_ROOT / "benchmarks").rglob("*.py"))}


SOURCES = _sources()
BENCHMARKS = _benchmark_sources()


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every ``import`` and ``from ... import`` in a file, lazy ones included."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def _dependencies(path: Path, prefix: str = "kdvfs.", known: dict[str, Path] = SOURCES) -> set[str]:
    """The modules under ``prefix`` a file imports (``from pkg import module`` counts as importing ``pkg.module``)."""
    deps = set()
    for module, names in _imports(path):
        if not module.startswith(prefix):
            continue
        submodules = {f"{module}.{name}" for name in names if f"{module}.{name}" in known}
        deps |= submodules or {module}
    return deps


def _kdvfs_dependencies(path: Path) -> set[str]:
    return _dependencies(path)


def _benchmark_dependencies(path: Path) -> set[str]:
    return _dependencies(path, "benchmarks.", BENCHMARKS)


def test_every_import_of_kdvfs_names_an_existing_module() -> None:
    missing = {(name, dep) for name, path in {**SOURCES, **BENCHMARKS}.items() for dep in _kdvfs_dependencies(path)
               if dep not in SOURCES}
    assert not missing


@pytest.mark.parametrize("package", PACKAGES)
def test_dependencies_flow_one_way(package: str) -> None:
    forbidden = tuple(f"kdvfs.{other}" for other in FORBIDDEN[package])
    wrong = {(name, dep) for name, path in SOURCES.items() if name.startswith(f"kdvfs.{package}")
             for dep in _kdvfs_dependencies(path) if forbidden and dep.startswith(forbidden)}
    assert not wrong


def test_no_package_imports_the_benchmarks() -> None:
    importing = {name for name, path in SOURCES.items() for module, _ in _imports(path)
                 if module.split(".")[0] == "benchmarks"}
    assert not importing


def test_benchmarks_import_each_other_by_package_path() -> None:
    """Every import of a benchmark module names ``benchmarks.<room>.<module>``: no bare sibling (``import
    provenance``, found only with the script's folder on ``sys.path``), no relative import, no room alone."""
    bare = {p.stem for p in BENCHMARKS.values()} | {name.split(".")[1] for name in BENCHMARKS if "." in name}
    wrong = set()
    for name, path in BENCHMARKS.items():
        tree = ast.parse(path.read_text())
        wrong |= {(name, f"level {node.level}") for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.level}
        for module, _ in _imports(path):
            if module.split(".")[0] in bare:
                wrong.add((name, module))
        wrong |= {(name, dep) for dep in _benchmark_dependencies(path) if dep not in BENCHMARKS or dep.count(".") != 2}
    assert not wrong


def test_no_import_cycles() -> None:
    graph = {name: _kdvfs_dependencies(path) - {name} for name, path in SOURCES.items()}
    graph |= {name: (_kdvfs_dependencies(path) | _benchmark_dependencies(path)) - {name}
              for name, path in BENCHMARKS.items()}
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
    silent = [name for name, path in {**SOURCES, **BENCHMARKS}.items()
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


DOCSTRING_ROOTS = ("common", "envs", "agents", "runtime", "benchmarks", "scripts", "examples")
MAX_MODULE_DOCSTRING_LINES = 20


def test_module_docstrings_are_contracts_not_essays() -> None:
    """A module docstring (the lines its literal spans) says what the unit owns, its units, invariants and
    failure modes in at most ``MAX_MODULE_DOCSTRING_LINES``; design reasoning goes to ``docs/design/``."""
    long = {}
    for root in DOCSTRING_ROOTS:
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            body = ast.parse(path.read_text()).body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                lines = (body[0].end_lineno or body[0].lineno) - body[0].lineno + 1
                if lines > MAX_MODULE_DOCSTRING_LINES:
                    long[str(path.relative_to(REPO_ROOT))] = lines
    assert not long


PARALLEL_BASENAMES: dict[str, set[str]] = {}
"""Basenames allowed to repeat inside one package: the same concept in parallel rooms (package -> basenames)."""
COMMAND_MODULES = "kdvfs.runtime.cli."
"""The CLI's modules are named for the ``kdvfs`` command they implement (``cli/offline/plan.py``: ``kdvfs
plan``), so they are left out: a command may share its name with what it makes."""


@pytest.mark.parametrize("package", PACKAGES)
def test_no_two_modules_of_a_package_share_a_basename(package: str) -> None:
    """A module is named for what it holds, so a name found in a traceback or an import names one module."""
    by_name: dict[str, list[str]] = {}
    for name, path in SOURCES.items():
        if name.startswith(f"kdvfs.{package}.") and path.name != "__init__.py" \
                and not name.startswith(COMMAND_MODULES):
            by_name.setdefault(path.stem, []).append(name)
    repeated = {stem: names for stem, names in by_name.items()
                if len(names) > 1 and stem not in PARALLEL_BASENAMES.get(package, set())}
    assert not repeated
