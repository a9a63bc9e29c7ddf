"""The fake NVML binding importable by name (``--nvml-module kdvfs.runtime.testing.nvml``), also in child processes.

It is one shared :class:`~kdvfs.runtime.testing.fake_nvml.EnergyFakeNvml` of the recorded H200 (:data:`FAKE`),
whose ``nvml*`` functions this module offers. Environment variables configure it in a child process:

* ``KDVFS_FAKE_NVML`` (JSON): ``{"gpus": 2, "power_w": 400, "failures": {"nvmlInit": 12}, "fail_from_call":
  {"nvmlDeviceSetGpuLockedClocks": [3, 999]}}``: ``gpus`` recorded H200s (default 1, UUIDs ending in their
  index), ``failures`` fail every call of a function with that NVML
  code, ``fail_from_call`` from its N-th call in the process on (1-based: a failure mid-run);
* ``KDVFS_FAKE_NVML_LOG``: a file to which the name of every call is appended (what a child process, the
  watchdog, ``kdvfs run``, did, for the test to read);
* ``KDVFS_FAKE_NVML_STATE``: a JSON file holding the locked clocks (``{"core": 1095, "mem": 2201}``), so
  that the GPU's lock state is shared by every process, as a real GPU's is; GPU ``i > 0`` keeps its own in
  ``FILE.gpuI`` (:func:`state_path`).

Tests in the same process use :data:`FAKE` directly (:func:`fresh`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pynvml

from kdvfs.runtime.testing.fake_nvml import EnergyFakeNvml, h200_from_probe

LOG_VARIABLE = "KDVFS_FAKE_NVML_LOG"
STATE_VARIABLE = "KDVFS_FAKE_NVML_STATE"
FAKE_NVML = True
"""Marks this binding as a fake: what kdvfs measures through it is no GPU's (``kdvfs run``'s summary says so)."""


class FileLocks(MutableMapping[str, int]):
    """The fake's locked clocks (``"core"``, ``"mem"`` -> MHz) in a JSON file, read and written on every access."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, int]:
        return dict(json.loads(self.path.read_text(encoding="utf-8"))) if self.path.is_file() else {}

    def _write(self, locks: dict[str, int]) -> None:
        partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(locks), encoding="utf-8")
        partial.replace(self.path)

    def __getitem__(self, key: str) -> int:
        return self._read()[key]

    def __setitem__(self, key: str, value: int) -> None:
        self._write({**self._read(), key: value})

    def __delitem__(self, key: str) -> None:
        locks = self._read()
        del locks[key]
        self._write(locks)

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


def state_path(path: Path, gpu: int) -> Path:
    """The lock-state file of fake GPU ``gpu`` when GPU 0's is ``path``."""
    return path if gpu == 0 else path.with_name(f"{path.name}.gpu{gpu}")


def _from_environment() -> tuple[EnergyFakeNvml, dict[str, tuple[int, int]]]:
    options = json.loads(os.environ.get("KDVFS_FAKE_NVML", "{}"))
    gpus = [h200_from_probe(number) for number in range(int(options.get("gpus", 1)))]
    fake = EnergyFakeNvml(gpus, float(options.get("power_w", 400.0)))
    fake.state.failures.update({name: int(code) for name, code in options.get("failures", {}).items()})
    if os.environ.get(STATE_VARIABLE):
        fake.locks = [FileLocks(state_path(Path(os.environ[STATE_VARIABLE]), gpu)) for gpu in range(len(gpus))]
    fail_from = {name: (int(call), int(code)) for name, (call, code) in options.get("fail_from_call", {}).items()}
    return fake, fail_from


FAKE, FAIL_FROM_CALL = _from_environment()
_CALLS: Counter[str] = Counter()


def fresh() -> EnergyFakeNvml:
    """The shared fake with its call log, injected failures, NVML initialisation and locked clocks cleared."""
    FAKE.state.calls.clear()
    FAKE.state.failures.clear()
    FAKE.state.init_count = 0
    for locks in FAKE.locks:
        locks.clear()
    return FAKE


def __getattr__(name: str) -> Any:
    value = getattr(FAKE, name)
    log_path = os.environ.get(LOG_VARIABLE)
    if not ((log_path or name in FAIL_FROM_CALL) and name.startswith("nvml")):
        return value

    def call(*args: Any) -> Any:
        if log_path:
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(name + "\n")
        _CALLS[name] += 1
        if name in FAIL_FROM_CALL and _CALLS[name] >= FAIL_FROM_CALL[name][0]:
            raise pynvml.NVMLError(FAIL_FROM_CALL[name][1])
        return value(*args)

    return call
