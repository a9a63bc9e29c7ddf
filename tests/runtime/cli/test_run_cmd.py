"""How ``kdvfs run`` words the end of a script that did not exit 0, and a summary whose figures are no GPU's."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table

from kdvfs.runtime.cli.live.run import script_end, summary_table
from kdvfs.runtime.controller.model.run_summary import JobSummary, Measured, NetEffect, Predicted
from tests.runtime.summaries import run_summary


@pytest.mark.parametrize(("code", "words"), [
    (137, "the script was killed by SIGKILL (exit code 137)"),
    (143, "the script was killed by SIGTERM (exit code 143)"),
    (1, "the script exited with code 1"),
    (2, "the script exited with code 2"),
    (250, "the script exited with code 250"),
])
def test_a_killed_script_is_named_as_killed(code: int, words: str) -> None:
    assert script_end(code) == words


MEASURED = Measured(3.35, [-20.0, 26.0], -5.37, [-15.0, 4.0], 6, 18)


def _summary(**fields: Any) -> JobSummary:
    summary = run_summary(dry_run=True, steps=2000, controlled_steps=1500, mismatches=1, switches=12,
                          step_time_s=0.03, energy_j_per_step=12.0, energy_j_per_step_auto=12.1,
                          energy_j_per_step_controlled=11.9, measured=MEASURED,
                          measured_net=NetEffect(3.35, [-20.0, 26.0], -5.37, [-15.0, 4.0], 0.75),
                          predicted=Predicted(12.3, 0.9, 3, 0.1, None), **fields)
    return JobSummary(summary, [])


def _text(table: Table) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def test_a_cpu_test_mode_summary_says_its_figures_mean_nothing() -> None:
    text = _text(summary_table(_summary(
        not_measured_on_a_gpu="CPU test mode on a fake NVML: ... the energy, saving and slowdown figures mean nothing",
        guard_off="CPU test mode: ... a measured slowdown is noise; the guard does not back off on it")))
    assert "! not a GPU measurement" in text and "figures mean nothing" in text
    assert text.count("(not a GPU's: means nothing)") == 2 and "guard off" in text, text
    plain = _text(summary_table(_summary(not_measured_on_a_gpu=None, guard_off=None)))
    assert "not a GPU" not in plain and "guard off" not in plain
