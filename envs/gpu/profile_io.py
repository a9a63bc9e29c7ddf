"""Writing GPU profiles: validated, atomic, in the layout of the shipped ``configs/gpus/*.yaml``."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kdvfs.common.config import load_yaml
from kdvfs.common.errors import KdvfsError, ProfileError
from kdvfs.common.files import write_text_atomic
from kdvfs.envs.gpu.profiles import CostParam, GpuProfile, load_profile


class _ProfileDumper(yaml.SafeDumper):
    """Flow style for collections of numbers (clock lists and ranges), block style for everything else."""


def _represent_collection(dumper: yaml.SafeDumper, data: dict[Any, Any] | list[Any]) -> yaml.Node:
    values = list(data.values()) if isinstance(data, dict) else data
    flow = bool(values) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if isinstance(data, dict):
        return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=flow)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_ProfileDumper.add_representer(dict, _represent_collection)
_ProfileDumper.add_representer(list, _represent_collection)


def write_profile_yaml(mapping: Mapping[str, Any], path: Path | str, header: str = "") -> GpuProfile:
    """Write ``mapping`` as a profile YAML at ``path`` (atomically) once it loads with ``load_profile``.

    The text is validated from a temporary copy first, so an invalid profile leaves ``path`` untouched.
    ``header`` (comment lines) goes on top. Returns the loaded profile.
    """
    path = Path(path)
    if path.suffix not in (".yaml", ".yml"):
        raise ProfileError(f"{path}: a GPU profile file must end in .yaml or .yml")
    text = header + yaml.dump(dict(mapping), Dumper=_ProfileDumper, sort_keys=False, width=110)
    with tempfile.TemporaryDirectory(prefix="kdvfs-profile-") as folder:
        check_path = Path(folder) / path.name
        write_text_atomic(check_path, text)
        try:
            profile = load_profile(check_path)
        except KdvfsError as error:
            raise ProfileError(f"not writing {path}: the profile does not validate ({error})") from None
    write_text_atomic(path, text)
    return profile


def leading_comments(path: Path) -> str:
    """The comment lines at the top of a YAML file (kept when the file is rewritten)."""
    lines = []
    for line in Path(path).read_text(encoding="utf-8").splitlines(keepends=True):
        if not line.startswith("#"):
            break
        lines.append(line)
    return "".join(lines)


def write_cost_model(source: Path, params: Mapping[str, CostParam], destination: Path | None = None) -> GpuProfile:
    """Rewrite a profile with a new ``cost_model`` section (to ``destination``, default in place)."""
    raw = load_yaml(source)
    if not isinstance(raw, dict):
        raise ProfileError(f"{source}: not a GPU profile (a YAML mapping)")
    raw["cost_model"] = {name: p.as_mapping() for name, p in params.items()}
    return write_profile_yaml(raw, destination or source, leading_comments(source))
