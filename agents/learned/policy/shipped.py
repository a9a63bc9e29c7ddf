"""The frozen policies kdvfs ships, one per GPU profile, named like the profiles (``h200``):
``policies/<name>.kdvfs-policy.npz``. Light: imports no numerical library."""

from __future__ import annotations

from pathlib import Path

from kdvfs.common.errors import KdvfsError
from kdvfs.common.paths import POLICY_DIR, POLICY_SUFFIX
from kdvfs.common.resolve import resolve_shipped, shipped_names


class PolicySourceError(KdvfsError):
    """A ``--policy`` argument that names no file and no shipped policy."""


def shipped_policies() -> list[str]:
    """Names of the shipped policies (their GPU profiles' names)."""
    return shipped_names(POLICY_DIR, POLICY_SUFFIX)


def policy_source_path(name_or_path: str | Path) -> Path:
    """A plan or policy file path as given, or the shipped policy named ``name_or_path`` (``h200``, any case).

    Raises:
        PolicySourceError: neither a file nor a shipped policy's name; the message lists the shipped ones.
    """
    return resolve_shipped(name_or_path, POLICY_DIR, POLICY_SUFFIX, "plan or policy", error=PolicySourceError,
                           name_kind="shipped policy", hint=" (`kdvfs plan -o` or a .kdvfs-policy.npz)")
