"""The watchdog process starts clean: no runpy warning (its package must not import it first) and no torch."""

from __future__ import annotations

import subprocess
import sys


def test_the_watchdog_module_runs_without_a_runpy_warning_or_torch() -> None:
    probe = ("import runpy, sys, warnings; warnings.simplefilter('error')\n"
             "runpy.run_module('kdvfs.runtime.device.watchdog', run_name='probe')\n"
             "assert 'torch' not in sys.modules, 'the watchdog imported torch'")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "Warning" not in done.stderr, done.stderr
