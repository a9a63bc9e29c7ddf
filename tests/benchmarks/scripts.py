"""The benchmark scripts' modules, for their tests: imported as the scripts run, with their folder on the path."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def script_module(name: str) -> ModuleType:
    """Benchmark script ``name``'s module (``benchmarks/NAME.py``)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
