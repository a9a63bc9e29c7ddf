"""The ``kdvfs`` command line. Each command module (``offline/``: no GPU needed; ``live/``: a training script or
a GPU) adds its parser with ``add_parser(subparsers)`` and sets ``func`` to a callable taking the parsed
arguments and returning the exit code; ``arguments`` and ``render`` are what they share.

Command modules import only what their parsers need; torch, stable-baselines3, scipy, matplotlib and gymnasium
are imported inside the command functions that use them, so ``kdvfs --help`` and the light commands start fast."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from kdvfs import __version__
from kdvfs.common.errors import KdvfsError
from kdvfs.runtime.cli.live import calibrate, capture, daemon, report, run
from kdvfs.runtime.cli.offline import demo, gpus, learn, model, plan, policy, predict, trace

COMMANDS = (demo, trace, gpus, model, predict, plan, capture, calibrate, learn, run, report, daemon, policy)


class UsageError(Exception):
    """A bad command line as a parser found it: the parser's ``prog`` (``kdvfs plan``), argparse's message and
    what the command adds to its ``--json`` error document (its ``json_error`` default)."""

    def __init__(self, prog: str, message: str, json_error: dict[str, Any]) -> None:
        super().__init__(f"{prog}: {message} (see `{prog} --help`)")
        self.prog, self.message, self.json_error = prog, message, json_error


class OneLineParser(argparse.ArgumentParser):
    """A parser whose usage errors raise :class:`UsageError`, which :func:`main` prints as one line on stderr,
    ``kdvfs CMD: error: ...``, with exit code 2 (``--help`` still shows the usage). Arguments no parser knows
    are the error of the innermost command parsed (``kdvfs run: unrecognized arguments: ...``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.set_defaults(usage_parser=self)  # the innermost parser's wins: a subparser's defaults come later

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, message, self.get_default("json_error") or {})

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            getattr(parsed, "usage_parser", self).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def build_parser() -> argparse.ArgumentParser:
    """The full ``kdvfs`` argument parser."""
    parser = OneLineParser(prog="kdvfs", description="Learned kernel-level GPU clock control.")
    parser.add_argument("--version", action="version", version=f"kdvfs {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    for module in COMMANDS:
        module.add_parser(subparsers)
    return parser


def wants_json(argv: list[str]) -> bool:
    """Whether ``--json`` (or an abbreviation argparse accepts, ``--js``) is on the command line before a ``--``
    (after it, the arguments are the training script's)."""
    options = argv[:argv.index("--")] if "--" in argv else argv
    return any(len(token) > 3 and "--json".startswith(token) for token in options)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kdvfs`` console script; returns the process exit code. A usage error (a bad flag or
    value, a missing option) raises ``SystemExit(2)`` as argparse's do, after its line on stderr and, with
    ``--json`` on the command line, its ``{"error": ...}`` document on stdout."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as error:
        if wants_json(argv):  # --json: stdout holds one JSON document in every outcome
            print(json.dumps({"error": str(error), **error.json_error}, indent=2))
        print(f"{error.prog}: error: {error.message} (see `{error.prog} --help`)", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        code = int(args.func(args))
        sys.stdout.flush()
        return code
    except KdvfsError as error:
        if getattr(args, "json", False):  # --json: stdout holds one JSON document in every outcome
            print(json.dumps({"error": str(error), **getattr(args, "json_error", {})}, indent=2))
        print(f"kdvfs: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if getattr(args, "json", False):
            print(json.dumps({"error": "interrupted"}, indent=2))
        print("kdvfs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`kdvfs trace list | head -1`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
