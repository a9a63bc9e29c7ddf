"""``kdvfs daemon --socket PATH [--group NAME] [--gpus IDX,...] [limits] [--nvml-module M]``: serve GPU clock control to
users without root (:mod:`kdvfs.runtime.daemon`), and the ``--daemon`` option of the commands that use it."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import IO

from kdvfs.runtime.daemon.connections import ConnectionLimits
from kdvfs.runtime.daemon.protocol import ENVIRONMENT_VARIABLE


def add_daemon_option(parser: argparse.ArgumentParser, what: str) -> None:
    """The ``--daemon PATH`` option of a command that changes clocks (``what``: what goes through it)."""
    parser.add_argument("--daemon", metavar="SOCKET",
                        help=f"{what} through the kdvfs daemon listening at SOCKET (default: ${ENVIRONMENT_VARIABLE} "
                             "when set, else NVML directly, which needs root); see docs/daemon.md")


def gpu_indices(text: str) -> list[int]:
    """An argparse type: comma-separated NVML indices (``0,1,3``)."""
    try:
        indices = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of GPU indices such as 0,1,3") from None
    if not indices or min(indices) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of GPU indices such as 0,1,3")
    return indices


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "daemon", help="serve GPU clock control to users without root over a Unix socket (run it as root)",
        usage="kdvfs daemon --socket PATH [--group NAME] [--gpus IDX,...] [--max-connections N] "
              "[--max-connections-per-uid N] [--idle-timeout-s S] [--nvml-module M]")
    parser.add_argument("--socket", required=True, type=Path, metavar="PATH",
                        help="the Unix socket to listen on (mode 0660)")
    parser.add_argument("--group", metavar="NAME",
                        help="the group whose members may use the socket, and so set the served GPUs' clocks "
                             "(default: root and the daemon's own group only)")
    parser.add_argument("--gpus", type=gpu_indices, metavar="IDX,...",
                        help="NVML indices of the GPUs to serve (default: all)")
    parser.add_argument("--nvml-module", default="pynvml", metavar="M", help="NVML binding to import (default pynvml)")
    parser.add_argument("--state", type=Path, metavar="FILE",
                        help="the file that records leased GPUs, reset at the next start if this daemon dies "
                             "(default: SOCKET.state.json beside the socket)")
    parser.add_argument("--log", type=Path, metavar="FILE",
                        help="append the JSON-lines request log to FILE (default: standard output, the journal "
                             "under systemd)")
    defaults = ConnectionLimits()
    parser.add_argument("--max-connections", type=int, default=defaults.max_connections, metavar="N",
                        help=f"serve at most N connections at once; more are refused in one line (default "
                             f"{defaults.max_connections}, lowered to fit the descriptor limit)")
    parser.add_argument("--max-connections-per-uid", type=int, default=defaults.max_per_uid, metavar="N",
                        help=f"serve at most N connections of one user at once (default {defaults.max_per_uid})")
    parser.add_argument("--idle-timeout-s", type=float, default=defaults.idle_timeout_s, metavar="S",
                        help="close a connection that holds no GPU after S seconds without a request (default "
                             f"{defaults.idle_timeout_s:g}; clients reconnect by themselves)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kdvfs.runtime.daemon.server import run_daemon

    with contextlib.ExitStack() as stack:
        log: IO[str] = sys.stdout
        if args.log is not None:
            args.log.parent.mkdir(parents=True, exist_ok=True)
            log = stack.enter_context(open(args.log, "a", encoding="utf-8"))
        limits = ConnectionLimits(args.max_connections, args.max_connections_per_uid, args.idle_timeout_s)
        return run_daemon(args.socket, args.group, args.gpus, args.nvml_module, args.state, log, limits)
