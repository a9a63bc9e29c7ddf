"""Write estimated cost-model parameters, with plausible ranges, into the profiles without measurements.

    python scripts/derive_profile_estimates.py   # from the repository root, after `kdvfs model fit --gpu h200 --write`

The H100, A100 and B200 profiles have no clock sweep: their time parameters, voltage curve, power window,
switch stall, memory background exponent and core-domain share of data-movement power are the H200's values
and ranges; their watts are the H200's scaled by the ratio of power limits (range +-30%); the boost limit 1.0
(range 0.85-1.0). Each says so (``transferred_from``), which widens its range in the ranges' sample. The
A100's voltage curve and static power come from public A100 readings instead (:func:`a100_grounded`). The
RTX 3080 Ti prior of ``scripts/fit_rtx3080ti_table1.py`` is made the same way from the GTX 1080 Ti fit, watts
+-50%. Why: ``docs/design/cost-model.md``.
"""

from __future__ import annotations

from collections.abc import Mapping

from kdvfs.common.config import load_yaml
from kdvfs.common.paths import DATA_DIR
from kdvfs.envs.calibration.fit import POWER_PARAMS, TIME_PARAMS, fit_params
from kdvfs.envs.calibration.sweep import load_sweep
from kdvfs.envs.gpu.profile_io import write_cost_model
from kdvfs.envs.gpu.profiles import CostParam, load_profile, profile_path
from kdvfs.envs.model.cost_model import CostParams

WATT_PARAMS = tuple(name for name in POWER_PARAMS if name.endswith("_w"))
GTX1080TI_TDP_W = 250.0
GDDR6X_J_PER_BIT = 7.25e-12
BOOST_RANGE = ((0.85, 1.0), "data-center parts boost to their highest clock when the cap allows (measured on the "
                            "H200); consumer parts stop below it under load")


def _watt_range(value: float, base: CostParam | None, label: str, ratio: float, spread: float
                ) -> tuple[tuple[float, float], str]:
    if base is not None and base.range is not None:
        return (base.range[0] * ratio, base.range[1] * ratio), f"{label} range x {ratio:.3f}: {base.range_source}"
    why = f"{label} value x {ratio:.3f} (power-limit ratio), +-{spread:.0%}"
    return (value * (1 - spread), value * (1 + spread)), why


def _entry(value: float, how: str, ranged: tuple[tuple[float, float], str], origin: str | None = None
           ) -> CostParam:
    (low, high), why = ranged
    bounds = (min(float(f"{low:.4g}"), value), max(float(f"{high:.4g}"), value))
    return CostParam(value, "estimate", f"estimate: {how}; no sweep of this GPU", bounds, why, origin)


def transferred(target: str, base: CostParams, base_label: str, base_limit_w: float, spread: float,
                base_entries: Mapping[str, CostParam] | None = None, origin: str | None = None
                ) -> dict[str, CostParam]:
    """Parameters for ``target``: ``base`` with watts scaled by the power-limit ratio, ranges as documented;
    each marked ``transferred_from=origin``."""
    h200 = load_profile("h200").cost_model
    ratio = float(load_yaml(profile_path(target))["power"]["limit_w"]) / base_limit_w
    entries = {}
    for name in CostParams.names():
        reference = h200[name]
        if name in WATT_PARAMS:
            value = getattr(base, name) * ratio
            ranged = _watt_range(value, (base_entries or {}).get(name), base_label, ratio, spread)
            how = f"{base_label} value x {ratio:.3f} (power-limit ratio)"
        else:
            value = getattr(base, name) if name in TIME_PARAMS else reference.value
            ranged = (BOOST_RANGE if reference.range is None
                      else (reference.range, f"H200 range: {reference.range_source}"))
            how = f"{base_label if name in TIME_PARAMS else 'H200'} value"
        entries[name] = _entry(value, how, ranged, origin)
    return entries


def rtx3080ti_prior() -> dict[str, CostParam]:
    """The RTX 3080 Ti parameters transferred from the GTX 1080 Ti fit: the prior of its Table 1 fit."""
    h200 = CostParams.from_profile(load_profile("h200"))
    free = [name for name in (*TIME_PARAMS, *POWER_PARAMS) if name != "mem_background_exponent"]
    gtx1080ti = fit_params(load_sweep(DATA_DIR / "sweeps" / "gtx1080ti.sweep.csv"), free=free)
    own = {name: getattr(gtx1080ti, name) for name in (*TIME_PARAMS, *WATT_PARAMS)}
    ampere_consumer = CostParams(**{**h200.__dict__, **own,
                                    "core_tensor_w": gtx1080ti.core_sm_w * h200.core_tensor_w / h200.core_sm_w})
    entries = transferred("rtx3080ti", ampere_consumer, "GTX 1080 Ti fit", GTX1080TI_TDP_W, 0.5)
    entries["mem_background_exponent"] = _entry(1.0, "linear in the memory clock (the GTX 1080 Ti sweep's four "
                                                "memory clocks do not determine it)",
                                                ((1.0, 3.0), "linear to cubic in the memory clock; GTX 980 fit 1.6"))
    bandwidth = float(load_yaml(profile_path("rtx3080ti"))["roofline"]["dram_bandwidth_bytes_per_s"])
    dram_w = bandwidth * 8 * GDDR6X_J_PER_BIT
    share = max(0.0, 1.0 - dram_w / entries["mem_traffic_w"].value)
    entries["traffic_core_share"] = _entry(share, f"1 - GDDR6X {dram_w:.0f} W (7.25 pJ/bit, "
                                           "Micron, at 912 GB/s) / data-movement power",
                                           ((0.0, 0.9), "GDDR5/5X sweeps fit 0; on-chip movement at most 0.9"))
    return entries


A100_IDLE_W = (59.0, (50.0, 72.0))
"""A100 SXM4 idle power at 210 MHz SM (W) and its spread over public readings (profile ``sources``)."""
A100_IDLE_CORE_MHZ, A100_MAX_CORE_MHZ = 210.0, 1410.0
A100_VOLTAGE = {
    "voltage_knee_fraction": (0.77, (0.766, 0.9),
                              "NVML reads 0.7125 V at 1080 MHz (NVIDIA/nvidia-docker#1648), the floor of the "
                              "0.700-0.719 V it reads at 210 MHz (public nvidia-smi -q, A100-SXM4-80GB): flat to at "
                              "least 1080 MHz = 0.766 of 1410",
                              "at least 0.766 (above); at most 0.9: IT4I caps its A100 SXM4s at 1290 MHz (0.915) "
                              "as an energy-saving measure (docs.it4i.cz/general/energy), so V rises below it"),
    "voltage_min": (0.8, (0.71, 0.88),
                    "the 0.70-0.72 V floor read by NVML over the voltage at 1410 MHz, which no public reading "
                    "gives; taken as 0.9 V (0.71 / 0.9 = 0.79)",
                    "0.71 (top at 1.0 V) to 0.88 (top at 0.82 V)"),
}


def a100_grounded(entries: Mapping[str, CostParam]) -> dict[str, CostParam]:
    """The A100's voltage curve from public NVML voltage readings and its static power from its measured idle
    power (W at 210 MHz, 1593 MHz memory) minus the transferred memory background and idle core power there."""
    grounded = {name: CostParam(value, "estimate", f"estimate: {how}", bounds, why)
                for name, (value, bounds, how, why) in A100_VOLTAGE.items()}
    core_idle_w = entries["core_idle_w"].value * grounded["voltage_min"].value ** 2 * A100_IDLE_CORE_MHZ
    core_idle_w /= A100_MAX_CORE_MHZ
    rest_w = entries["mem_background_w"].value + core_idle_w + entries["leakage_w"].value
    idle_w, (low_w, high_w) = A100_IDLE_W
    static_w, bounds = round(idle_w - rest_w, 2), (round(low_w - rest_w, 2), round(high_w - rest_w, 2))
    grounded["static_w"] = CostParam(
        static_w, "estimate", f"estimate: measured idle {idle_w:g} W at 210 MHz (profile sources) minus "
        f"{rest_w:.1f} W of transferred memory background and idle core power", bounds,
        f"public A100 SXM4 idle readings {low_w:g}-{high_w:g} W minus the same {rest_w:.1f} W")
    return {**entries, **grounded}


def main() -> None:
    h200 = load_profile("h200")
    params = CostParams.from_profile(h200)
    for name in ("h100-sxm", "a100-sxm4", "b200"):
        entries = transferred(name, params, "H200", 700.0, 0.3, h200.cost_model, origin="h200")
        write_cost_model(profile_path(name), a100_grounded(entries) if name == "a100-sxm4" else entries)
    print("wrote estimated cost-model parameters for h100-sxm, a100-sxm4, b200")


if __name__ == "__main__":
    main()
