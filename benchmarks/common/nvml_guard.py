"""The real pynvml behind a recording guard, for dry runs on a real GPU
(``--nvml-module benchmarks.common.nvml_guard``).

Every ``nvml*`` call is counted; a call that could change GPU state (``nvml*Set*``, ``nvml*Reset*``,
``nvml*Clear*``) is refused with a ``RuntimeError`` before it reaches the driver, and counted as refused.
At exit the counts go to the JSON file named by ``KDVFS_NVML_RECORD``.
"""

from __future__ import annotations

import atexit
import json
import os
import re
from collections import Counter
from typing import Any

import pynvml

CALLS: Counter[str] = Counter()
REFUSED: Counter[str] = Counter()
STATE_CHANGING = re.compile(r"nvml\w*(Set|Reset|Clear)\w*")


def __getattr__(name: str) -> Any:
    value = getattr(pynvml, name)
    if not (name.startswith("nvml") and callable(value)):
        return value

    def call(*args: Any) -> Any:
        if STATE_CHANGING.fullmatch(name):
            REFUSED[name] += 1
            raise RuntimeError(f"benchmarks.common.nvml_guard refused {name}: a dry run must not change GPU state")
        CALLS[name] += 1
        return value(*args)

    return call


def record() -> dict[str, dict[str, int]]:
    """The calls so far: ``{"calls": {name: count}, "refused": {name: count}}``."""
    return {"calls": dict(CALLS), "refused": dict(REFUSED)}


def _dump() -> None:
    path = os.environ.get("KDVFS_NVML_RECORD")
    if path:
        with open(path, "w", encoding="utf-8") as file:
            json.dump(record(), file)


atexit.register(_dump)
