"""Locations of the files kdvfs ships in its repository (GPU profiles, configs, bundled traces).

kdvfs is installed from a clone (``pip install -e .``); these paths are relative to that clone. Set
``KDVFS_HOME`` to point at another copy of the repository's ``configs/`` and ``data/`` folders.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(os.environ.get("KDVFS_HOME", Path(__file__).resolve().parents[2]))
CONFIG_DIR = REPO_ROOT / "configs"
GPU_PROFILE_DIR = CONFIG_DIR / "gpus"
DATA_DIR = REPO_ROOT / "data"
BUNDLED_TRACE_DIR = DATA_DIR / "traces"
RAW_DATA_DIR = DATA_DIR / "raw"
