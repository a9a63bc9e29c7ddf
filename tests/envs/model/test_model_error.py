"""The shipped model-error file: which evidence each profile's ranges rest on, and the file's failure modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kdvfs.common.errors import DataMissingError, KdvfsError
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.model_error import FIGURES, MODEL_ERROR_PATH, has_own_data, load_model_error, range_basis


@pytest.mark.parametrize(("gpu", "own", "level", "clocks"), [
    ("h200", True, "h200", "fitted"),
    ("rtx3080ti", True, "transfer", "rtx3080ti"),
    ("a100-sxm4", False, "transfer", "transfer"),
    ("h100-sxm", False, "transfer", "transfer"),
    ("b200", False, "transfer", "transfer"),
])
def test_each_profile_rests_on_its_own_data_where_it_has_any(gpu: str, own: bool, level: str, clocks: str) -> None:
    profile = load_profile(gpu)
    basis = range_basis(profile)
    assert has_own_data(profile) is basis.own_data is own
    assert (basis.level.key, basis.clocks.key) == (level, clocks)
    assert (basis.note is None) is own and (own or profile.model in (basis.note or ""))


def test_the_shipped_file_holds_every_figure_for_every_body() -> None:
    evidence = load_model_error()
    assert set(evidence) == {"level", "clocks"}
    for bodies in evidence.values():
        for body in bodies.values():
            assert set(body.values) == set(FIGURES) and body.source
    assert evidence["level"]["h200"].count("energy_j") >= 20
    document = json.loads(MODEL_ERROR_PATH.read_text())
    assert document["command"] == "python scripts/derive_model_error.py" and document["git_revision"]


def test_a_missing_or_foreign_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataMissingError, match="derive_model_error"):
        load_model_error(tmp_path / "none.json")
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(KdvfsError, match="not a kdvfs-model-error file"):
        load_model_error(foreign)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"format": "kdvfs-model-error", "level": {"h200": {"source": "x", "figures": {}}},
                                  "clocks": {}}))
    with pytest.raises(KdvfsError, match="malformed"):
        load_model_error(broken)
