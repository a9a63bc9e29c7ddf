"""Locations of the files kdvfs ships: GPU profiles, workload presets, PPO configs, bundled traces and sweeps,
policies.

They install with the package: ``kdvfs/configs``, ``kdvfs/data`` and ``kdvfs/policies`` are links to the
repository's top-level folders, so the same paths hold in a clone (editable install) and in a wheel.
``KDVFS_HOME``, when set, names a folder of the same layout (``configs/``, ``data/``, ``policies/``) that
replaces the shipped data.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The clone (``pip install -e .``) or, installed from a wheel, the ``kdvfs`` package folder."""
HOME_VARIABLE = "KDVFS_HOME"
DATA_ROOT = Path(os.environ.get(HOME_VARIABLE) or REPO_ROOT)
CONFIG_DIR = DATA_ROOT / "configs"
GPU_PROFILE_DIR = CONFIG_DIR / "gpus"
DATA_DIR = DATA_ROOT / "data"
BUNDLED_TRACE_DIR = DATA_DIR / "traces"
RAW_DATA_DIR = DATA_DIR / "raw"
SWEEP_DIR = DATA_DIR / "sweeps"
POLICY_DIR = DATA_ROOT / "policies"
POLICY_SUFFIX = ".kdvfs-policy.npz"
"""The suffix of a frozen policy file (``kdvfs train`` writes ``policy.kdvfs-policy.npz``)."""


def shipped_policy_path(gpu: str) -> Path:
    """Where the policy shipped for GPU profile ``gpu`` lives: ``policies/<gpu>.kdvfs-policy.npz``."""
    return POLICY_DIR / f"{gpu}{POLICY_SUFFIX}"
