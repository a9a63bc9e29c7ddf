"""Write estimated cost-model parameters into the profiles that have no measurements of their own.

No clock sweep exists for the H100, A100, RTX 3080 Ti or B200 profiles, so their parameters are
estimates transferred from the measured ones, each with a source that says how:

* time parameters (how kernels slow with clocks): those of the calibrated H200 profile, except the
  RTX 3080 Ti, which takes the GTX 1080 Ti fit (the consumer part of the public sweeps);
* watts: the H200's calibrated watts (for the RTX 3080 Ti the GTX 1080 Ti fit's) scaled by the ratio of
  power limits; voltage curve, power window and switch stall: the H200's estimates;
* the core-domain share of data-movement power: the H200's for HBM parts; for the RTX 3080 Ti, what is
  left after GDDR6X's ~7.25 pJ/bit (Micron) at 912 GB/s out of the transferred data-movement power.

Run from the repository root after `kdvfs model fit ... --gpu h200 --write`:

    python scripts/derive_profile_estimates.py
"""

from __future__ import annotations

from kdvfs.envs.calibration.fit import POWER_PARAMS, TIME_PARAMS, fit_params
from kdvfs.envs.calibration.sweep import load_sweep
from kdvfs.envs.common.paths import DATA_DIR
from kdvfs.envs.gpu.profile_io import write_cost_model
from kdvfs.envs.gpu.profiles import CostParam, load_profile, profile_path
from kdvfs.envs.model.cost_model import CostParams

WATT_PARAMS = tuple(name for name in POWER_PARAMS if name.endswith("_w"))
GTX1080TI_TDP_W = 250.0
GDDR6X_J_PER_BIT = 7.25e-12


def transferred(target: str, base: CostParams, base_label: str, base_limit_w: float) -> dict[str, CostParam]:
    """Parameters for ``target``: ``base`` with watts scaled by the power-limit ratio."""
    h200 = CostParams.from_profile(load_profile("h200"))
    ratio = load_profile(target).power.limit_w / base_limit_w
    entries = {}
    for name in CostParams.names():
        if name in WATT_PARAMS:
            value, how = getattr(base, name) * ratio, f"{base_label} value x {ratio:.3f} (power-limit ratio)"
        elif name in TIME_PARAMS:
            value, how = getattr(base, name), f"{base_label} value"
        else:
            value, how = getattr(h200, name), "H200 value"
        entries[name] = CostParam(value, "estimate", f"estimate: {how}; no sweep of this GPU")
    return entries


def main() -> None:
    h200 = CostParams.from_profile(load_profile("h200"))
    gtx1080ti = fit_params(load_sweep(DATA_DIR / "sweeps" / "gtx1080ti.sweep.csv"))
    gtx1080ti_power = {name: getattr(gtx1080ti, name) for name in (*TIME_PARAMS, *WATT_PARAMS)}
    ampere_consumer = CostParams(**{**h200.__dict__, **gtx1080ti_power,
                                    "core_tensor_w": gtx1080ti.core_sm_w * h200.core_tensor_w / h200.core_sm_w})
    for name in ("h100-sxm", "a100-sxm4", "b200"):
        write_cost_model(profile_path(name), transferred(name, h200, "H200", 700.0))
    entries = transferred("rtx3080ti", ampere_consumer, "GTX 1080 Ti fit", GTX1080TI_TDP_W)
    dram_w = load_profile("rtx3080ti").roofline.dram_bandwidth_bytes_per_s * 8 * GDDR6X_J_PER_BIT
    share = max(0.0, 1.0 - dram_w / entries["mem_traffic_w"].value)
    entries["traffic_core_share"] = CostParam(share, "estimate", f"estimate: 1 - GDDR6X {dram_w:.0f} W "
                                              "(7.25 pJ/bit, Micron, at 912 GB/s) / data-movement power")
    write_cost_model(profile_path("rtx3080ti"), entries)
    print("wrote estimated cost-model parameters for h100-sxm, a100-sxm4, b200, rtx3080ti")


if __name__ == "__main__":
    main()
