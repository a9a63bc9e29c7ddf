"""The A100 profile's energy-optimal uniform core clock and E(f) of a GPT-3 XL layer against public A100 facts.

One generated GPT-3 XL layer (``configs/workloads/gpt3xl.yaml``, 1 layer) priced on ``a100-sxm4`` at every
locked core clock: step energy and time relative to auto, at the profile's 400 W limit and at 500 W (the HGX
boards that allow it), and with the voltage curve and static power the profile had before it was grounded
(transferred from the H200). The public facts it is compared with are the profile's ``sources``
(``docs/design/cost-model.md``). Writes ``benchmarks/results/a100_grounding.json``, ``.md`` and
``a100_energy_vs_clock.png``. From the repository root:

    python -m benchmarks.model.a100_grounding
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from benchmarks.common.provenance import RESULTS, provenance, provenance_lines, write_results
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile
from kdvfs.envs.model.cost_tables import build_tables
from kdvfs.envs.synthetic.generator import generate_transformer_trace, load_workload

GROUNDED = ("voltage_min", "voltage_knee_fraction", "static_w")
BAND_MHZ = (1080.0, 1290.0)
TABLE_MHZ = (210, 420, 630, 840, 960, 1080, 1185, 1290, 1350, 1410)


def before_grounding(profile: GpuProfile) -> GpuProfile:
    """``profile`` with its voltage curve and static power as transferred from the H200 (watts by the
    power-limit ratio), as the profile held them before it was grounded."""
    h200 = load_profile("h200").cost_model
    ratio = profile.power.limit_w / 700.0
    values = {name: h200[name].value * (ratio if name.endswith("_w") else 1.0) for name in GROUNDED}
    return replace(profile, cost_model={**profile.cost_model, **{
        name: replace(profile.cost_model[name], value=value, range=None, range_source=None, status="calibrated")
        for name, value in values.items()}})


def curve(profile: GpuProfile) -> dict[str, Any]:
    """Step energy and time at each locked core clock relative to auto, the optimum and the auto clock."""
    trace = generate_transformer_trace(replace(load_workload("gpt3xl"), layers=1), profile)
    tables = build_tables(trace, profile)
    gap = tables.gap_s
    energy = tables.energy_j.sum(axis=0) + (gap[:, None] * tables.gap_power_w[None, :]).sum(axis=0)
    time = tables.time_s.sum(axis=0) + gap.sum()
    auto_energy = float((tables.auto_energy_j[:, 0] + gap * tables.auto_gap_power_w[:, 0]).sum())
    auto_time = float(tables.auto_time_s[:, 0].sum() + gap.sum())
    core = tables.pairs_mhz[:, 0]
    best = int(np.argmin(energy))
    gemm = np.array(["gemm" in k.name for k in trace.kernels])
    return {"core_mhz": core.tolist(), "energy_rel": (energy / auto_energy).tolist(),
            "time_rel": (time / auto_time).tolist(), "optimum_mhz": float(core[best]),
            "optimum_energy_rel": float(energy[best] / auto_energy), "optimum_time_rel": float(time[best] / auto_time),
            "auto_power_w": auto_energy / auto_time, "kernels": len(trace),
            "auto_gemm_core_mhz": float(np.average(tables.auto_core_mhz[gemm, 0], weights=tables.auto_time_s[gemm, 0]))}


def _at(result: dict[str, Any], mhz: float, key: str) -> float:
    return float(result[key][int(np.argmin(np.abs(np.array(result["core_mhz"]) - mhz)))])


def _plot(cases: dict[str, dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    for label, result in cases.items():
        axis.plot(result["core_mhz"], result["energy_rel"], label=label)
    axis.axvspan(*BAND_MHZ, color="grey", alpha=0.2, label="public band")
    axis.set_xlabel("locked core clock (MHz)")
    axis.set_ylabel("step energy / auto")
    axis.set_title("a100-sxm4: one GPT-3 XL layer")
    axis.legend()
    figure.tight_layout()
    figure.savefig(RESULTS / "a100_energy_vs_clock.png", dpi=120)
    plt.close(figure)


def _markdown(result: dict[str, Any]) -> str:
    cases = result["cases"]
    lines = ["# A100: energy-optimal uniform core clock of a GPT-3 XL layer", "",
             *provenance_lines(result["provenance"]), "",
             f"Public band of the energy-optimal clock: {BAND_MHZ[0]:g}-{BAND_MHZ[1]:g} MHz (voltage at its floor "
             "up to 1080 MHz; IT4I's energy-saving cap at 1290 MHz). Plot: `a100_energy_vs_clock.png`.", "",
             "| case | optimum | E / auto there | T / auto there | E(1290) / E(1410) | T(1290) / T(1410) | "
             "E(210) / auto | auto power | auto GEMM clock |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, r in cases.items():
        ratio_e = _at(r, 1290, "energy_rel") / _at(r, 1410, "energy_rel")
        ratio_t = _at(r, 1290, "time_rel") / _at(r, 1410, "time_rel")
        lines.append(f"| {label} | {r['optimum_mhz']:.0f} MHz | {r['optimum_energy_rel']:.3f} | "
                     f"{r['optimum_time_rel']:.3f} | {ratio_e:.3f} | {ratio_t:.3f} | {_at(r, 210, 'energy_rel'):.2f} | "
                     f"{r['auto_power_w']:.0f} W | {r['auto_gemm_core_mhz']:.0f} MHz |")
    lines += ["", "## E(f) and T(f) relative to auto", "", "| core MHz | " + " | ".join(cases) + " |",
              "| ---: | " + " | ".join("---:" for _ in cases) + " |"]
    for mhz in TABLE_MHZ:
        lines.append(f"| {mhz} | " + " | ".join(f"E {_at(r, mhz, 'energy_rel'):.3f}, T {_at(r, mhz, 'time_rel'):.3f}"
                                                  for r in cases.values()) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    profile = load_profile("a100-sxm4")
    cases = {"grounded, 400 W": curve(profile),
             "grounded, 500 W": curve(replace(profile, power=replace(profile.power, limit_w=500.0))),
             "before (H200 transfer), 400 W": curve(before_grounding(profile))}
    result = {"provenance": provenance("python -m benchmarks.model.a100_grounding"), "band_mhz": list(BAND_MHZ),
              "cases": cases}
    write_results("a100_grounding", result, _markdown(result))
    _plot(cases)
    print(_markdown(result))


if __name__ == "__main__":
    main()
