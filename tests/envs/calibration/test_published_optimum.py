"""Table 1 of arXiv 2601.08539: strict loading, the step it describes, and fitting parameters to it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kdvfs.envs.calibration.optimum_fit import fit_published, published_changes
from kdvfs.envs.calibration.published_optimum import (
    GENERATED_KERNELS,
    TABLE1_PATH,
    PublishedKernel,
    load_published_optimum,
    table1_step,
)
from kdvfs.envs.calibration.sweep import SweepError
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.cost_model import CostParams
from kdvfs.envs.trace.trace import Category, Trace

RTX = load_profile("rtx3080ti")


def test_table1_loads_with_its_fit_and_held_out_halves() -> None:
    rows = load_published_optimum()
    assert len(rows) == len(GENERATED_KERNELS) == 46
    assert [r.index for r in rows if r.fitted] == list(range(19))
    assert {r.section for r in rows if not r.fitted} == {"backward", "embedding backward"}
    assert rows[17] == PublishedKernel(17, "GEMM", "loss", 5001, 1680, 8.98, -29.31)
    assert rows[0].mem_mhz is None and rows[2].core_mhz is None and sum(r.is_gemm for r in rows) == 21


@pytest.mark.parametrize(("old", "new", "message"), [
    ("index,kernel,section", "index,name,section", "columns"),
    ("2,GEMM,forward,5001", "2,GEMM,forward,fast", "positive integer"),
    ("2,GEMM,forward,5001", "2,GEMM,sideways,5001", "section"),
    ("2,GEMM,forward,5001", "7,GEMM,forward,5001", "in order"),
])
def test_malformed_tables_are_clear_errors(tmp_path: Path, old: str, new: str, message: str) -> None:
    path = tmp_path / "table1.csv"
    path.write_text(TABLE1_PATH.read_text().replace(old, new, 1))
    with pytest.raises(SweepError, match=message):
        load_published_optimum(path)


def test_the_step_takes_each_kernel_from_the_generated_layer() -> None:
    step = table1_step(RTX)
    assert len(step) == 46 and step.has_features.all()
    gemm = np.array([r.is_gemm for r in load_published_optimum()])
    assert all(k.category is Category.GEMM for k, g in zip(step.kernels, gemm, strict=True) if g)
    assert (step.tensor_util[gemm] > 0.5).all() and (step.dram_util[~gemm] > step.sm_util[~gemm]).all()


def test_the_default_pair_changes_nothing() -> None:
    rows = [r for r in load_published_optimum() if r.mem_mhz is None and r.core_mhz is None]
    step = table1_step(RTX)
    kernels = Trace(step.meta, tuple(step.kernels[r.index] for r in rows))
    time, energy = published_changes(CostParams.from_profile(RTX), RTX, kernels, rows)
    assert np.allclose(time, 0.0) and np.allclose(energy, 0.0)


def test_a_fit_recovers_the_parameters_that_made_the_changes() -> None:
    """Changes the model itself predicts at known parameters; the fit starts elsewhere and finds them."""
    rows = [load_published_optimum()[i] for i in (2, 11, 15, 17)]
    step = table1_step(RTX)
    kernels = Trace(step.meta, tuple(step.kernels[r.index] for r in rows))
    truth = CostParams.from_profile(RTX)
    time, energy = published_changes(truth, RTX, kernels, rows)
    made = [replace(r, time_pct=float(t), energy_pct=float(e)) for r, t, e in zip(rows, time, energy, strict=True)]
    start = replace(truth, voltage_min=truth.voltage_min + 0.1)
    fit = fit_published(RTX, kernels, made, start, {"voltage_min": (0.3, 1.0)}, free=("voltage_min",),
                        prior=truth)
    assert fit.params.voltage_min == pytest.approx(truth.voltage_min, abs=0.01)
    assert fit.cost < 0.01 and fit.std["voltage_min"] > 0
