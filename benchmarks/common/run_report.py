"""The command line of a benchmark that runs on a device machine and is reported here: ``run OUT`` (the
measurement, its log a JSON file) and ``report LOG [--name STEM]`` (``benchmarks/results/STEM.{json,md}``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.common.provenance import provenance, provenance_lines

DEVICE_RUN_KEYS = ("machine", "command", "started_utc", "gpu")
"""What a results file keeps of the device run's log (``device_run``)."""


def run_report_parser(doc: str, default_name: str) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The parser (its description ``doc``'s first line) and its ``run`` subcommand, which takes ``out`` and the
    benchmark's own options; ``report`` takes ``log`` and ``--name`` (default ``default_name``)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run_parser = sub.add_parser("run")
    run_parser.add_argument("out", type=Path)
    report_parser = sub.add_parser("report")
    report_parser.add_argument("log", type=Path)
    report_parser.add_argument("--name", default=default_name, help="results file stem")
    return parser, run_parser


def number_cell(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec`` for a table cell; ``-`` for None."""
    return "-" if value is None else format(value, spec)


def device_report(module: str, log_path: Path, name: str, log: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """What ``report`` of benchmark ``module`` starts its results file with, from the device run's ``log`` (read from
    ``log_path``): the record (provenance of this report, ``device_run``) and the Markdown lines under its title
    (the provenance, the device run's command, machine and start)."""
    record = {**provenance(f"python -m {module} report {log_path} --name {name}"),
              "device_run": {key: log[key] for key in DEVICE_RUN_KEYS}}
    return record, [*provenance_lines(record),
                    f"- device run: `{log['command']}` on `{log['machine']}`, {log['started_utc']}"]
