"""The cost model's validated error that every prediction's range is built from (``configs/model_error.json``).

The file is written by ``python scripts/derive_model_error.py`` from the repository's real measurements
(:mod:`kdvfs.envs.calibration.residuals`); nothing is recomputed at run time. It holds *evidence*: log
residuals ``log(measured / predicted)`` of each figure (``step_time_s``, ``energy_j``, ``avg_power_w``) from one
body of measurements, under two headings:

* ``level``: a whole step at the clocks it was recorded at. Keyed by GPU profile name where the repository holds
  real captures of that GPU (the H200), else ``transfer`` (the public sweeps, one GPU's parameters carried to
  the other; step times from the captures).
* ``clocks``: a step's figure at other clocks relative to auto (a saving, a slowdown, a locked pair against
  auto). Keyed by profile name where that GPU has per-kernel measurements at other clocks of its own (the RTX 3080
  Ti's Table 1), ``fitted`` for a profile with per-kernel data of its own (parameters fitted on the GPU: the
  public sweeps' leave-kernels-out error), ``transfer`` for one without (every parameter from another GPU).

A profile has per-kernel data of its own when any of its cost-model parameters is ``calibrated``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.errors import DataMissingError, KdvfsError
from kdvfs.common.paths import CONFIG_DIR
from kdvfs.envs.gpu.profiles import GpuProfile

MODEL_ERROR_PATH = CONFIG_DIR / "model_error.json"
FORMAT = "kdvfs-model-error"
FIGURES = ("step_time_s", "energy_j", "avg_power_w")
TRANSFER, FITTED = "transfer", "fitted"


@dataclass(frozen=True)
class Evidence:
    """Log residuals of each figure (``FIGURES`` keys) from one body of measurements: ``key`` names it in the
    file (a profile name, ``fitted`` or ``transfer``), ``source`` says what was measured."""

    key: str
    source: str
    values: Mapping[str, Array]

    def count(self, figure: str) -> int:
        """How many measurements stand behind ``figure``'s residuals."""
        return len(self.values[figure])

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "source": self.source, "measurements": self.count("energy_j")}


@dataclass(frozen=True)
class RangeBasis:
    """The evidence a profile's ranges rest on: ``level`` (a step at its recorded clocks), ``clocks`` (a step's
    change with its clocks); ``own_data``: the profile has per-kernel data of its own; ``note``: one line for
    users when it has not, else None."""

    profile: str
    level: Evidence
    clocks: Evidence
    own_data: bool
    note: str | None

    def as_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "own_data": self.own_data, "level": self.level.as_json(),
                "clocks": self.clocks.as_json(), "note": self.note}


def _evidence(key: str, body: Mapping[str, Any], where: Path) -> Evidence:
    try:
        values = {figure: np.asarray(body["figures"][figure], dtype=np.float64) for figure in FIGURES}
        source = str(body["source"])
    except (KeyError, TypeError, ValueError) as error:
        raise KdvfsError(f"{where}: evidence {key!r} is malformed ({error}); re-run "
                         "`python scripts/derive_model_error.py`") from None
    if any(len(v) == 0 or not np.all(np.isfinite(v)) for v in values.values()):
        raise KdvfsError(f"{where}: evidence {key!r} needs finite residuals for every figure")
    return Evidence(key, source, values)


@cache
def load_model_error(path: Path = MODEL_ERROR_PATH) -> dict[str, dict[str, Evidence]]:
    """The file's evidence: ``{"level": {key: Evidence}, "clocks": {key: Evidence}}``.

    Raises:
        DataMissingError: the file is missing (kdvfs installed without its configs).
        KdvfsError: it is not a model-error file, or a body is malformed.
    """
    if not path.is_file():
        raise DataMissingError(f"{path}: no model-error file; reinstall kdvfs or run "
                               "`python scripts/derive_model_error.py`")
    document = json.loads(path.read_text())
    if document.get("format") != FORMAT:
        raise KdvfsError(f"{path}: not a {FORMAT} file")
    try:
        return {heading: {key: _evidence(key, body, path) for key, body in document[heading].items()}
                for heading in ("level", "clocks")}
    except (KeyError, AttributeError) as error:
        raise KdvfsError(f"{path}: missing section {error}; re-run `python scripts/derive_model_error.py`") from None


def has_own_data(profile: GpuProfile) -> bool:
    """True when any cost-model parameter of ``profile`` was calibrated on measurements of that GPU."""
    return any(param.status == "calibrated" for param in profile.cost_model.values())


def range_basis(profile: GpuProfile, evidence: Mapping[str, Mapping[str, Evidence]] | None = None) -> RangeBasis:
    """The evidence ``profile``'s ranges rest on (from :func:`load_model_error` unless ``evidence`` is given)."""
    evidence = load_model_error() if evidence is None else evidence
    own = has_own_data(profile)
    level = evidence["level"].get(profile.name) or evidence["level"][TRANSFER]
    clocks = evidence["clocks"].get(profile.name) or evidence["clocks"][FITTED if own else TRANSFER]
    note = None if own else (f"no per-kernel data of the {profile.model}: its parameters are transferred from "
                             "another GPU, and its ranges use the error of such a transfer between the public "
                             "sweeps (wide)")
    return RangeBasis(profile.name, level, clocks, own, note)
