"""The fake NVML binding importable by name (``--nvml-module kdvfs.runtime.testing.nvml``), also in child processes.

It is one shared :class:`~kdvfs.runtime.testing.fake_nvml.EnergyFakeNvml` of the recorded H200 (:data:`FAKE`),
whose ``nvml*`` functions this module offers. The environment variable ``KDVFS_FAKE_NVML`` (JSON) configures
it in a child: ``{"power_w": 400, "failures": {"nvmlInit": 12}}``. When ``KDVFS_FAKE_NVML_LOG`` names a file,
the name of every call is appended to it: what a child process (the watchdog, ``kdvfs run``) did, for the
test to read. Tests in the same process use :data:`FAKE` directly (:func:`fresh`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from kdvfs.runtime.testing.fake_nvml import EnergyFakeNvml, h200_from_probe

LOG_VARIABLE = "KDVFS_FAKE_NVML_LOG"


def _from_environment() -> EnergyFakeNvml:
    options = json.loads(os.environ.get("KDVFS_FAKE_NVML", "{}"))
    fake = EnergyFakeNvml([h200_from_probe()], float(options.get("power_w", 400.0)))
    fake.state.failures.update({name: int(code) for name, code in options.get("failures", {}).items()})
    return fake


FAKE = _from_environment()


def fresh() -> EnergyFakeNvml:
    """The shared fake with its call log, injected failures and locked clocks cleared."""
    FAKE.state.calls.clear()
    FAKE.state.failures.clear()
    FAKE.locked.clear()
    return FAKE


def __getattr__(name: str) -> Any:
    value = getattr(FAKE, name)
    log_path = os.environ.get(LOG_VARIABLE)
    if not (log_path and name.startswith("nvml")):
        return value

    def call(*args: Any) -> Any:
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(name + "\n")
        return value(*args)

    return call
