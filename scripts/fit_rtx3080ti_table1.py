"""Fit the ``rtx3080ti`` profile's cost model to the RTX 3080 Ti's own measurements (arXiv 2601.08539, Table 1).

Fitted on the embedding, forward and loss kernels (0-18) only; the backward and embedding-backward kernels
(19-45) are held out (``python -m benchmarks.model.rtx3080ti_table1`` reports both). The prior and the starting
point are the parameters transferred from the GTX 1080 Ti fit (``derive_profile_estimates.rtx3080ti_prior``),
so the fit does not depend on what the profile held before. Each fitted parameter's +-2 standard
errors of the fit (linearised, prior included) are stated in its source; the switch stall and the power
window, which Table 1 does not touch, stay estimates with their ranges. Run from the repository root (after
``python scripts/derive_profile_estimates.py``):

    python scripts/fit_rtx3080ti_table1.py
"""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime
from pathlib import Path

from derive_profile_estimates import rtx3080ti_prior

from kdvfs.common.config import load_yaml
from kdvfs.envs.calibration.fit import param_bounds
from kdvfs.envs.calibration.optimum_fit import Table1Fit, fit_published_multistart
from kdvfs.envs.calibration.published_optimum import TABLE1_PATH, load_published_optimum, table1_step
from kdvfs.envs.gpu.profile_io import write_cost_model, write_profile_yaml
from kdvfs.envs.gpu.profiles import CostParam, GpuProfile, profile_path
from kdvfs.envs.model.cost_model import CostParams


def prior_profile(prior: dict[str, CostParam]) -> GpuProfile:
    """The shipped ``rtx3080ti`` profile with the prior's cost model (validated through a temporary file)."""
    raw = load_yaml(profile_path("rtx3080ti"))
    raw["cost_model"] = {name: entry.as_mapping() for name, entry in prior.items()}
    with tempfile.TemporaryDirectory(prefix="kdvfs-table1-") as folder:
        return write_profile_yaml(raw, Path(folder) / "rtx3080ti.yaml")


def fitted_entries(fit: Table1Fit, prior: dict[str, CostParam], limit_w: float) -> dict[str, CostParam]:
    """The fitted parameters as calibrated entries, their +-2 standard errors in the source; the rest as in the
    prior. The fit pins combinations of parameters, not each one (most marginal ranges span much of the fit
    bounds), so the standard errors are stated, not sampled as independent ranges."""
    date = datetime.now(UTC).date().isoformat()
    entries = dict(prior)
    for name in fit.free:
        value = getattr(fit.params, name)
        (low,), (high,) = param_bounds([name], 2.0 * limit_w)
        spread = f"{max(low, value - 2 * fit.std[name]):.3g}-{min(high, value + 2 * fit.std[name]):.3g}"
        entries[name] = CostParam(value, "calibrated", f"kdvfs fit to arXiv 2601.08539 Table 1, kernels 0-18 "
                                  f"(embedding, forward, loss) of {TABLE1_PATH.name} ({date}); +-2 standard "
                                  f"errors {spread}")
    return entries


def main() -> None:
    prior = rtx3080ti_prior()
    profile = prior_profile(prior)
    rows = load_published_optimum()
    step = table1_step(profile)
    fit_rows = [row for row in rows if row.fitted]
    fit_step = type(step)(step.meta, tuple(kernel for kernel, row in zip(step.kernels, rows, strict=True)
                                          if row.fitted))
    ranges = {name: entry.range for name, entry in prior.items() if entry.range is not None}
    fit = fit_published_multistart(profile, fit_step, fit_rows, CostParams.from_profile(profile), ranges)
    write_cost_model(profile_path("rtx3080ti"), fitted_entries(fit, prior, profile.power.limit_w))
    print(f"wrote the rtx3080ti cost model fitted on {len(fit_rows)} Table 1 kernels (robust cost {fit.cost:.2f})")


if __name__ == "__main__":
    main()
