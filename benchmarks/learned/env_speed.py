"""Speed of the environment and of a frozen decision, one process on one core.

The H200 training config's environment over its held-out steps with random actions, as shipped, with every
disturbance on (latency spread, duration noise, drift, step jitter), with runs of 4 steps, and on the
every-core-clock grid; then the shipped H200 policy's decision time. Writes
``benchmarks/results/env_speed.json`` and ``.md``:

    python -m benchmarks.learned.env_speed
"""

from __future__ import annotations

from typing import Any

from benchmarks.common.provenance import provenance, provenance_lines, write_results
from benchmarks.learned.policies import decision_time, env_speed

GPU = "h200"
VARIANTS: dict[str, dict[str, Any]] = {
    "as trained (latency spread, 2% duration noise)": {},
    "every disturbance on (+ drift, step jitter)": {"drift": True, "step_jitter": True},
    "every disturbance, runs of 4 steps": {"drift": True, "step_jitter": True, "run_steps": 4},
    "every-core-clock grid (55 levels x 2 memory clocks)": {"every_core_clock": True},
}


def _markdown(result: dict[str, Any]) -> str:
    lines = ["# Environment and frozen-policy speed", "", *provenance_lines(result["provenance"]), "",
             f"## {GPU}: one environment, random actions, one process", "",
             "| environment | decisions/s (median) | best round | kernels/s |", "| --- | ---: | ---: | ---: |"]
    for name, speed in result["env"].items():
        lines.append(f"| {name} | {speed['decisions_per_s']:,.0f} | {speed['best_decisions_per_s']:,.0f} | "
                     f"{speed['kernels_per_s']:,.0f} |")
    frozen = result["frozen"]
    lines += ["", f"Frozen {GPU} policy, one forward pass on a whole observation ({frozen['observation_size']} "
              f"inputs): median {frozen['median_s'] * 1e6:.1f} us, p99 {frozen['p99_s'] * 1e6:.1f} us.", ""]
    return "\n".join(lines)


def main() -> None:
    result = {"provenance": provenance("python -m benchmarks.learned.env_speed"),
              "env": {name: env_speed(GPU, rounds=5, seconds=1.0, **settings) for name, settings in VARIANTS.items()},
              "frozen": decision_time(GPU)}
    write_results("env_speed", result, _markdown(result))
    print(_markdown(result))


if __name__ == "__main__":
    main()
