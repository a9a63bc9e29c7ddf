"""The importer registry: a new format is one module in kdvfs.envs.trace.importers; unknown formats are refused."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kdvfs.common.errors import TraceFormatError
from kdvfs.envs.trace import importers, importing
from kdvfs.envs.trace.importing import import_trace, importer_formats, read_recording
from kdvfs.envs.trace.trace import Phase

TOY_IMPORTER = '''"""A toy format: a JSON list of [name, start_us, dur_us], one per kernel."""
import json
from pathlib import Path

from kdvfs.envs.trace.importing import Activity, Recording, register_importer
from kdvfs.envs.trace.trace import Kind


@register_importer("toy-rows")
def read_toy_rows(path: Path) -> Recording:
    activities = [Activity(name, Kind.KERNEL, start_us, dur_us, (1, 1, 1), (32, 1, 1), None, None, None, None)
                  for name, start_us, dur_us in json.loads(path.read_text())]
    return Recording(path, activities, [], None, "toy GPU")
'''


@pytest.fixture
def toy_importer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The file a contributor adds, dropped into the importers package for one test."""
    folder = tmp_path / "importers"
    folder.mkdir()
    (folder / "toy_rows.py").write_text(TOY_IMPORTER)
    monkeypatch.setattr(importing, "_READERS", dict(importing._READERS))
    monkeypatch.setattr(importers, "__path__", [*importers.__path__, str(folder)])
    yield "toy-rows"
    sys.modules.pop(f"{importers.__name__}.toy_rows", None)


def test_kineto_is_registered_and_the_default() -> None:
    assert "kineto" in importer_formats() and importing.DEFAULT_FORMAT == "kineto"


def test_a_new_importer_is_one_module(toy_importer: str, tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    step = [["embedding_fwd", 0.0], ["gemm", 10.0], ["gemm_backward", 20.0], ["adam_step", 30.0]]
    path.write_text(json.dumps([[name, start_us + 40.0 * k, 5.0] for k in range(2) for name, start_us in step]))
    assert toy_importer in importer_formats()
    trace = import_trace(path, toy_importer, step=0)
    assert [k.phase for k in trace.kernels] == [Phase.FORWARD, Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER]
    assert trace.meta.source == "toy-rows:rows.json" and trace.meta.gpu == "toy GPU"
    assert trace.kernels[1].gap_before_s == pytest.approx(5e-6)


def test_unknown_format_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"unknown trace format 'nope'; known formats: .*kineto"):
        read_recording(tmp_path / "t.json", "nope")
