"""Derive the cost model's validated error, ``configs/model_error.json``, from the repository's real measurements.

Usage: ``python scripts/derive_model_error.py`` (about a minute on one core). Every prediction's range rests on
this file (``kdvfs.envs.model.model_error``); what it holds and how it is measured:
``kdvfs.envs.calibration.residuals`` and ``docs/design/cost-model.md`` (Uncertainty). Writes the file with the
run's command, machine, Python, date and revision, and prints each body's residual quantiles.
"""

from __future__ import annotations

import json
import platform
import sys
from datetime import UTC, datetime

import numpy as np

from kdvfs.common.run_record import git_revision
from kdvfs.envs.calibration.residuals import model_error_document
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.model_error import FORMAT, MODEL_ERROR_PATH

COMMAND = "python scripts/derive_model_error.py"


def main() -> None:
    evidence = model_error_document(load_profile("h200"), load_profile("rtx3080ti"))
    document = {"format": FORMAT, "version": 1, "command": COMMAND, "machine": platform.node(),
                "python": sys.version.split()[0], "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
                "git_revision": git_revision(),
                "residual": "log(measured / predicted) of each figure", **evidence}
    for heading in ("level", "clocks"):
        for key, body in document[heading].items():
            for figure, values in body["figures"].items():
                low, median, high = np.quantile(values, [0.05, 0.5, 0.95])
                print(f"{heading:6s} {key:10s} {figure:12s} n={len(values):3d}  5% {low:+.4f}  50% {median:+.4f}  "
                      f"95% {high:+.4f}")
    MODEL_ERROR_PATH.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {MODEL_ERROR_PATH}")


if __name__ == "__main__":
    main()
