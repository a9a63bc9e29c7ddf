"""``--help`` of every kdvfs command and subcommand prints its usage and exits 0 (help strings are %-formatted)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from kdvfs.runtime.cli import build_parser


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The argv prefix of every parser in the tree: the top level, each command, each subcommand."""
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, (*path, name))


COMMANDS = list(_commands(build_parser()))


def test_the_tree_holds_commands_and_subcommands() -> None:
    assert {("compare",), ("trace", "import"), ("model", "fit"), ("gpus", "local")} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: " ".join(command) or "kdvfs")
def test_help_exits_zero_with_usage(command: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args([*command, "--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: kdvfs {' '.join(command)}".rstrip())
