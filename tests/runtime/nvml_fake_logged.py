"""The fake NVML of :mod:`tests.runtime.nvml_fake`, appending the name of every call to the file named by
``KDVFS_FAKE_NVML_LOG``: what a child process (the watchdog, ``kdvfs run``) did, for the test to read."""

from __future__ import annotations

import os
from typing import Any

from tests.runtime.nvml_fake import FAKE


def __getattr__(name: str) -> Any:
    value = getattr(FAKE, name)
    if not name.startswith("nvml"):
        return value

    def call(*args: Any) -> Any:
        path = os.environ.get("KDVFS_FAKE_NVML_LOG")
        if path:
            with open(path, "a", encoding="utf-8") as log:
                log.write(name + "\n")
        return value(*args)

    return call
