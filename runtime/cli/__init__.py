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
from typing import NoReturn

from kdvfs import __version__
from kdvfs.envs.common.errors import KdvfsError
from kdvfs.runtime.cli.live import calibrate, capture, daemon, report, run
from kdvfs.runtime.cli.offline import demo, gpus, learn, model, plan, policy, predict, trace

COMMANDS = (demo, trace, gpus, model, predict, plan, capture, calibrate, learn, run, report, daemon, policy)


class OneLineParser(argparse.ArgumentParser):
    """A parser whose usage errors are one line on stderr, ``kdvfs CMD: error: ...``, exit code 2 (``--help``
    still shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The full ``kdvfs`` argument parser."""
    parser = OneLineParser(prog="kdvfs", description="Learned kernel-level GPU clock control.")
    parser.add_argument("--version", action="version", version=f"kdvfs {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    for module in COMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kdvfs`` console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
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
